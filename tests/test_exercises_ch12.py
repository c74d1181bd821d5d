"""Chapter 12's Titans checker against the package: a step made of NeuralMemory in
Titans' order (the gradient at W_(t-1), twice the learning rate because its loss carries
a 1/2) passes; NeuralMemory's default order (the gradient at the forgotten weights) is
named as a mistake."""

import pytest

from attention import NeuralMemory
from attention.exercises import ExerciseError, ch12


def _neural_memory_step(gradient_at):
    def step(weight, momentum, k, v, theta, eta, alpha):
        e, d = weight.shape
        memory = NeuralMemory(d, e, gradient_at=gradient_at, dtype=weight.dtype)
        memory.state = {"weights": [weight], "momentum": [momentum]}
        memory.update(
            k[None],
            v[None],
            learning_rate=2 * theta.reshape(1),
            momentum=eta.reshape(1),
            forgetting=alpha.reshape(1),
        )
        return memory.state["weights"][0], memory.state["momentum"][0]

    return step


def test_neural_memory_in_titans_order_passes_the_titans_checker(capsys):
    step = _neural_memory_step("previous")
    step.__name__ = "neural_memory_step"
    ch12.check_titans_update(step)
    assert capsys.readouterr().out.startswith("✓ neural_memory_step: ")


def test_neural_memory_in_its_default_order_is_named_as_the_forgotten_point():
    with pytest.raises(ExerciseError, match="previous weights"):
        ch12.check_titans_update(_neural_memory_step("forgotten"))
