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


def my_logsumexp(x, dim=-1):
    """log(sum(exp(x))) along dim, with the maximum taken out first."""
    m = x.amax(dim, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))).squeeze(dim)


def my_logsumexp_stub(x, dim=-1):
    """log(sum(exp(x))) along dim, with the maximum taken out first."""
    raise NotImplementedError("write your solution here")


def logsumexp_without_the_shift(x, dim=-1):
    return torch.log(torch.exp(x).sum(dim))


def logsumexp_that_forgets_the_maximum(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return torch.log(torch.exp(x - m).sum(dim))


def logsumexp_with_keepdim(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))


def my_jacobian(z):
    """The softmax Jacobian diag(s) - s s^T, one (n, n) matrix per row of z."""
    s = torch.softmax(z, dim=-1)
    return torch.diag_embed(s) - s.unsqueeze(-1) * s.unsqueeze(-2)


def my_jacobian_stub(z):
    """The softmax Jacobian diag(s) - s s^T, one (n, n) matrix per row of z."""
    raise NotImplementedError("write your solution here")


def jacobian_without_the_outer_product(z):
    return torch.diag_embed(torch.softmax(z, -1))


def jacobian_with_the_sign_flipped(z):
    s = torch.softmax(z, -1)
    return torch.outer(s, s) - torch.diag(s) if z.dim() == 1 else None


def jacobian_for_one_row_only(z):
    s = torch.softmax(z, -1)
    return torch.diag(s) - torch.outer(s, s)


def jacobian_of_the_scores(z):
    return torch.diag_embed(z) - z.unsqueeze(-1) * z.unsqueeze(-2)


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
    Row(
        ch02.check_logsumexp,
        my_logsumexp,
        my_logsumexp_stub,
        (
            (logsumexp_without_the_shift, "the maximum is not taken out"),
            (logsumexp_that_forgets_the_maximum, "not added back"),
            (logsumexp_with_keepdim, "the axis dim is kept"),
        ),
    ),
    Row(
        ch02.check_softmax_jacobian,
        my_jacobian,
        my_jacobian_stub,
        (
            (jacobian_without_the_outer_product, "only diag(s)"),
            (jacobian_with_the_sign_flipped, "the sign is flipped"),
            (jacobian_for_one_row_only, "for a batch use torch.diag_embed"),
            (jacobian_of_the_scores, "the scores z are used"),
        ),
    ),
]
