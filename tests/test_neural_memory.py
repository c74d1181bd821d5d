"""Tests for attention/efficient/neural_memory.py: the identity with the gated delta
rule, the hand-written gradients against autograd, Titans' update against a reference
loop, and the boundary checks."""

import pytest
import torch

from attention import NeuralMemory, gated_delta_rule_attention

F64 = torch.float64


def data(n=9, d=4, e=3, batch=(2,), seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n, d, generator=g, dtype=F64)
    k = torch.nn.functional.normalize(
        torch.randn(*batch, n, d, generator=g, dtype=F64), dim=-1
    )
    v = torch.randn(*batch, n, e, generator=g, dtype=F64)
    theta = torch.rand(*batch, n, generator=g, dtype=F64)
    alpha = 0.3 * torch.rand(*batch, n, generator=g, dtype=F64)
    return q, k, v, theta, alpha


def test_linear_memory_without_momentum_is_the_gated_delta_rule():
    """beta = theta, exp(g) = 1 - alpha, scale = 1, state = W^T (the documented
    mapping)."""
    q, k, v, theta, alpha = data()
    mem = NeuralMemory(4, 3, dtype=F64)
    out = mem(q, k, v, learning_rate=theta, forgetting=alpha)
    ref, state = gated_delta_rule_attention(
        q, k, v, theta, torch.log1p(-alpha), scale=1.0, output_final_state=True
    )
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(mem.weights[0].transpose(-2, -1), state)


def test_titans_order_differs_unless_nothing_is_forgotten():
    q, k, v, theta, alpha = data()
    forgotten = NeuralMemory(4, 3, dtype=F64)(
        q, k, v, learning_rate=theta, forgetting=alpha
    )
    previous = NeuralMemory(4, 3, dtype=F64, gradient_at="previous")
    assert not torch.allclose(
        previous(q, k, v, learning_rate=theta, forgetting=alpha), forgotten
    )
    a = NeuralMemory(4, 3, dtype=F64)(q, k, v, learning_rate=theta)
    b = NeuralMemory(4, 3, dtype=F64, gradient_at="previous")(
        q, k, v, learning_rate=theta
    )
    torch.testing.assert_close(a, b)


def titans_reference(mem, keys, values, theta, eta, alpha, gradient_at):
    """Titans' update with autograd computing the surprise: one sample per step, batch
    of 1."""
    weights = [w.detach().clone() for w in mem.weights]
    momentum = [torch.zeros_like(w) for w in weights]
    for t in range(keys.shape[-2]):
        forgotten = [(1 - alpha) * w for w in weights]
        at = [
            w.clone().requires_grad_()
            for w in (forgotten if gradient_at == "forgotten" else weights)
        ]
        x = keys[t]
        y = at[0] @ x if len(at) == 1 else at[1] @ torch.nn.functional.silu(at[0] @ x)
        loss = 0.5 * ((y - values[t]) ** 2).sum()
        grads = torch.autograd.grad(loss, at)
        momentum = [eta * s - theta * gr for s, gr in zip(momentum, grads, strict=True)]
        weights = [w + s for w, s in zip(forgotten, momentum, strict=True)]
    return weights


@pytest.mark.parametrize("hidden_dim", [None, 6])
@pytest.mark.parametrize("gradient_at", ["forgotten", "previous"])
def test_update_with_momentum_and_forgetting_matches_an_autograd_reference(
    hidden_dim, gradient_at
):
    _, k, v, _, _ = data(batch=())
    torch.manual_seed(0)
    mem = NeuralMemory(
        4,
        3,
        hidden_dim=hidden_dim,
        learning_rate=0.4,
        momentum=0.6,
        forgetting=0.1,
        gradient_at=gradient_at,
        dtype=F64,
    )
    if (
        hidden_dim is not None
    ):  # a non-zero second layer so both layers learn from step one
        with torch.no_grad():
            mem.weight2.normal_()
    ref = titans_reference(mem, k, v, 0.4, 0.6, 0.1, gradient_at)
    surprise = mem.update(k, v)
    for a, b in zip(mem.weights, ref, strict=True):
        torch.testing.assert_close(a, b)
    assert surprise.shape == (9,) and (surprise >= 0).all()


def test_retrieve_reads_without_changing_the_memory():
    q, k, v, _, _ = data()
    mem = NeuralMemory(4, 3, hidden_dim=8, learning_rate=0.5, dtype=F64)
    mem.update(k, v)
    before = [w.clone() for w in mem.weights]
    first = mem.retrieve(q)
    torch.testing.assert_close(mem.retrieve(q), first)
    for a, b in zip(mem.weights, before, strict=True):
        assert torch.equal(a, b)


def test_orthonormal_keys_are_stored_exactly_with_unit_learning_rate():
    keys = torch.eye(5, dtype=F64)
    values = torch.randn(5, 2, dtype=F64, generator=torch.Generator().manual_seed(1))
    mem = NeuralMemory(5, 2, learning_rate=1.0, dtype=F64)
    mem.update(keys, values)
    torch.testing.assert_close(mem.retrieve(keys), values)


def test_updates_in_two_calls_equal_one_call_and_reset_starts_again():
    _, k, v, _, _ = data()
    one = NeuralMemory(4, 3, hidden_dim=5, momentum=0.5, dtype=F64)
    two = NeuralMemory(4, 3, hidden_dim=5, momentum=0.5, dtype=F64)
    two.load_state_dict(one.state_dict())
    one.update(k, v)
    two.update(k[:, :4], v[:, :4])
    two.update(k[:, 4:], v[:, 4:])
    for a, b in zip(one.weights, two.weights, strict=True):
        torch.testing.assert_close(a, b)
    one.reset()
    assert not one.retrieve(
        k
    ).any()  # zero second layer: the initial memory reads zeros


def test_gradients_flow_to_the_initial_weights_and_inputs():
    q, k, v, _, _ = data(n=4, d=3, e=2, batch=(1,))
    k.requires_grad_()
    mem = NeuralMemory(3, 2, hidden_dim=4, learning_rate=0.3, momentum=0.2, dtype=F64)
    with torch.no_grad():
        mem.weight2.normal_()

    def fresh(keys):
        mem.reset()  # every call starts from the initial weights
        return mem(q, keys, v)

    assert torch.autograd.gradcheck(fresh, (k,))
    mem.reset()
    out = mem(q, k, v)
    out.sum().backward()
    assert (
        mem.weight1.grad is not None
        and mem.weight2.grad is not None
        and k.grad is not None
    )


# --------------------------------------------------------------------------- bad input


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="learning_rate must be >= 0"):
        NeuralMemory(4, 3, learning_rate=-0.1)
    with pytest.raises(ValueError, match=r"forgetting must lie in \[0, 1\]"):
        NeuralMemory(4, 3, forgetting=1.5)
    with pytest.raises(ValueError, match=r"momentum must lie in \[0, 1\]"):
        NeuralMemory(4, 3, momentum=-1.0)
    with pytest.raises(ValueError, match="gradient_at must be one of"):
        NeuralMemory(4, 3, gradient_at="next")


def test_bad_inputs_are_refused():
    q, k, v, theta, _ = data()
    mem = NeuralMemory(4, 3, dtype=F64)
    with pytest.raises(
        ValueError, match="keys must have last dimension d = key_dim = 4"
    ):
        mem.update(k[..., :3], v)
    with pytest.raises(
        ValueError, match="values must have last dimension e = value_dim = 3"
    ):
        mem.update(k, v[..., :2])
    with pytest.raises(ValueError, match=r"keys and values must share \(\.\.\., n\)"):
        mem.update(k, v[:, :4])
    with pytest.raises(TypeError, match="must have the dtype of the memory's weights"):
        mem.update(k.float(), v.float())
    with pytest.raises(
        ValueError, match=r"forgetting must lie in \[0, 1\], got values"
    ):
        mem.update(k, v, forgetting=theta + 1.0)


@pytest.mark.parametrize("bad", [[1.0, 2.0], 3, "k", None])
@pytest.mark.parametrize("which", ["key", "value"])
def test_forward_checks_key_and_value_not_only_query(bad, which):
    q, k, v, _, _ = data()
    mem = NeuralMemory(4, 3, dtype=F64)
    args = {"key": k, "value": v} | {which: bad}
    with pytest.raises(
        TypeError, match=f"{which} must be a torch.Tensor, got {type(bad).__name__}"
    ):
        mem(q, args["key"], args["value"])
    with pytest.raises(TypeError, match="query must have the dtype of the memory's"):
        mem(q.float(), k, v)


def test_per_token_rates_must_give_one_value_per_token():
    """A rate tensor broadcasts to (..., n), one value per token; any other shape is
    refused in update and in forward (where a 0-d tensor also works, as a number
    does)."""
    q, k, v, theta, _ = data()  # (2, 9, ·)
    mem = NeuralMemory(4, 3, dtype=F64)
    for rate in (theta[:, :4], theta[..., None], torch.rand(3, dtype=F64)):
        for call in (mem.update, lambda *kv, **rates: mem(q, *kv, **rates)):
            with pytest.raises(
                ValueError,
                match=r"learning_rate must be a number or one value per token, a "
                r"tensor that broadcasts to \(\.\.\., n\) = \(2, 9\), got shape",
            ):
                call(k, v, learning_rate=rate)
    shared = NeuralMemory(4, 3, dtype=F64)  # (n,) and 0-d rates broadcast
    ref = NeuralMemory(4, 3, dtype=F64)
    torch.testing.assert_close(
        shared(q, k, v, learning_rate=theta[0]),
        ref(q, k, v, learning_rate=theta[0].expand(2, 9)),
    )
    shared.reset()
    ref.reset()
    torch.testing.assert_close(
        shared(q, k, v, learning_rate=torch.tensor(0.3, dtype=F64)),
        ref(q, k, v, learning_rate=0.3),
    )


def test_retrieve_with_another_batch_size_is_refused():
    _, k, v, _, _ = data(batch=(2,))
    mem = NeuralMemory(4, 3, dtype=F64)
    mem.update(k, v)
    with pytest.raises(
        ValueError,
        match=r"the batch dims of queries and of the memory \(set by the last update\) "
        r"must broadcast against each other, got \(3,\) and \(2,\)",
    ):
        mem.retrieve(torch.randn(3, 5, 4, dtype=F64))


def test_constructor_checks_dtype_and_device():
    with pytest.raises(TypeError, match="dtype must be a torch.dtype, got str"):
        NeuralMemory(4, 3, dtype="float64")
    with pytest.raises(TypeError, match="dtype must be a floating-point dtype"):
        NeuralMemory(4, 3, dtype=torch.int64)
    with pytest.raises(TypeError, match="device must be a torch.device, a string"):
        NeuralMemory(4, 3, device=1.5)
    with pytest.raises(ValueError, match="device is not a valid device: 'gpu0'"):
        NeuralMemory(4, 3, device="gpu0")
