"""Chapter 2's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import torch

from attention.exercises import ch02
from exercise_rows import Row


def my_softmax(x, dim=-1):
    """Softmax of x along dim, from its formula."""
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


def my_softmax_stub(x, dim=-1):
    """Softmax of x along dim, from its formula."""
    raise NotImplementedError("write your solution here")


def softmax_without_the_shift(x, dim=-1):
    e = x.exp()
    return e / e.sum(dim, keepdim=True)


def softmax_over_the_last_axis(x, dim=-1):
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True)


def softmax_without_keepdim(x, dim=-1):
    e = torch.exp(x - x.max(dim).values)
    return e / e.sum(dim)


def softmax_shifted_by_the_global_max(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim, keepdim=True)


def my_step(m, l, scores):  # noqa: E741
    """One online-softmax step: the new running max and running sum."""
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    l_new = l * torch.exp(m - m_new) + torch.exp(scores - m_new.unsqueeze(-1)).sum(-1)
    return m_new, l_new


def my_step_stub(m, l, scores):  # noqa: E741
    """One online-softmax step: the new running max and running sum."""
    raise NotImplementedError("write your solution here")


def step_without_rescaling(m, l, scores):  # noqa: E741
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    return m_new, l + torch.exp(scores - m_new.unsqueeze(-1)).sum(-1)


def step_with_the_block_max_only(m, l, scores):  # noqa: E741
    m_new = scores.max(dim=-1).values
    l_new = l * torch.exp(m - m_new) + torch.exp(scores - m_new.unsqueeze(-1)).sum(-1)
    return m_new, l_new


def step_without_shifting_the_block(m, l, scores):  # noqa: E741
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    return m_new, l * torch.exp(m - m_new) + torch.exp(scores).sum(-1)


ROWS = [
    Row(
        ch02.check_softmax,
        my_softmax,
        my_softmax_stub,
        (
            (softmax_without_the_shift, "the max shift is missing"),
            (softmax_over_the_last_axis, "dim is ignored"),
            (softmax_without_keepdim, "use keepdim=True"),
            (softmax_shifted_by_the_global_max, "the maximum is taken over the whole"),
        ),
    ),
    Row(
        ch02.check_online_softmax_step,
        my_step,
        my_step_stub,
        (
            (step_without_rescaling, "the old sum is not rescaled"),
            (step_with_the_block_max_only, "forgets the running one"),
            (step_without_shifting_the_block, "exponentials are not shifted"),
        ),
    ),
]
