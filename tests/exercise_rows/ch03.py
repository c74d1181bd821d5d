"""Chapter 3's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch03
from exercise_rows import Row


def my_scaled_scores(q, k):
    """Scores q K^T / sqrt(d) for (..., i, d) queries and (..., j, d) keys."""
    d = q.shape[-1]
    return q @ k.transpose(-2, -1) / math.sqrt(d)


def my_scaled_scores_stub(q, k):
    """Scores q K^T / sqrt(d) for (..., i, d) queries and (..., j, d) keys."""
    raise NotImplementedError("write your solution here")


def scores_without_the_scale(q, k):
    return q @ k.transpose(-2, -1)


def scores_divided_by_d(q, k):
    return q @ k.transpose(-2, -1) / q.shape[-1]


def scores_scaled_by_the_number_of_keys(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2])


def scores_with_k_dot_t(q, k):
    return q @ k.T / math.sqrt(q.shape[-1])


def my_entropy(p):
    """The entropy, in nats, of each row of weights p (last axis)."""
    return -torch.special.xlogy(p, p).sum(dim=-1)


def my_entropy_stub(p):
    """The entropy, in nats, of each row of weights p (last axis)."""
    raise NotImplementedError("write your solution here")


def entropy_with_nan_on_zeros(p):
    return -(p * torch.log(p)).sum(-1)


def entropy_in_bits(p):
    return -torch.special.xlogy(p, p).sum(-1) / math.log(2)


def entropy_without_the_minus(p):
    return torch.special.xlogy(p, p).sum(-1)


def entropy_as_a_mean(p):
    return -torch.special.xlogy(p, p).mean(-1)


def my_query_jacobian(q, k, scale):
    """da/dq for one query q (d,), keys k (n, d), logits z = scale * k @ q: (n, d)."""
    a = torch.softmax(scale * (k @ q), dim=-1)  # (n,)
    jac_z = torch.diag(a) - torch.outer(a, a)  # (n, n), da/dz
    return jac_z @ (scale * k)  # dz/dq = scale * k


def my_query_jacobian_stub(q, k, scale):
    """da/dq for one query q (d,), keys k (n, d), logits z = scale * k @ q: (n, d)."""
    raise NotImplementedError("write your solution here")


def jacobian_forgetting_the_chain_scale(q, k, scale):
    a = torch.softmax(scale * (k @ q), dim=-1)
    return (torch.diag(a) - torch.outer(a, a)) @ k


def jacobian_of_unscaled_logits(q, k, scale):
    a = torch.softmax(k @ q, dim=-1)
    return (torch.diag(a) - torch.outer(a, a)) @ (scale * k)


def jacobian_transposed(q, k, scale):
    a = torch.softmax(scale * (k @ q), dim=-1)
    return (scale * k).T @ (torch.diag(a) - torch.outer(a, a))


ROWS = [
    Row(
        ch03.check_scaled_scores,
        my_scaled_scores,
        my_scaled_scores_stub,
        (
            (scores_without_the_scale, "the 1/sqrt(d) is missing"),
            (scores_divided_by_d, "divided by d"),
            (scores_scaled_by_the_number_of_keys, "the number of keys"),
            (scores_with_k_dot_t, "use k.transpose(-2, -1)"),
        ),
    ),
    Row(
        ch03.check_row_entropy,
        my_entropy,
        my_entropy_stub,
        (
            (entropy_with_nan_on_zeros, "torch.xlogy"),
            (entropy_in_bits, "in bits"),
            (entropy_without_the_minus, "the minus sign is missing"),
            (entropy_as_a_mean, "a mean over the keys"),
        ),
    ),
    Row(
        ch03.check_query_jacobian,
        my_query_jacobian,
        my_query_jacobian_stub,
        (
            (jacobian_forgetting_the_chain_scale, "the scale is missing"),
            (jacobian_of_unscaled_logits, "unscaled logits"),
            (jacobian_transposed, "with shape (4, 6)"),
        ),
    ),
]
