"""Chapter 9's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import torch

from attention.exercises import ch09
from exercise_rows import Row

# ------------------------------------------------------------------- cosine


def my_cosine_scores(q, k):
    """Cosine scores: q.k / (|q| |k|) for every query-key pair."""
    q = q / q.norm(dim=-1, keepdim=True)
    k = k / k.norm(dim=-1, keepdim=True)
    return q @ k.transpose(-2, -1)


def my_cosine_scores_stub(q, k):
    """Cosine scores: q.k / (|q| |k|) for every query-key pair."""
    raise NotImplementedError("write your solution here")


def cosine_without_normalising(q, k):
    return q @ k.transpose(-2, -1)


def cosine_normalising_the_queries_only(q, k):
    return (q / q.norm(dim=-1, keepdim=True)) @ k.transpose(-2, -1)


# ------------------------------------------------------------------- additive


def my_additive_scores(q, k, w_q, w_k, v):
    """Additive scores: v . tanh(W1 q_i + W2 k_j) for every pair."""
    hidden = (q @ w_q.T)[..., :, None, :] + (k @ w_k.T)[..., None, :, :]
    return torch.tanh(hidden) @ v


def my_additive_scores_stub(q, k, w_q, w_k, v):
    """Additive scores: v . tanh(W1 q_i + W2 k_j) for every pair."""
    raise NotImplementedError("write your solution here")


def additive_without_tanh(q, k, w_q, w_k, v):
    hidden = (q @ w_q.T)[..., :, None, :] + (k @ w_k.T)[..., None, :, :]
    return hidden @ v


def additive_summing_the_hidden_units(q, k, w_q, w_k, v):
    hidden = (q @ w_q.T)[..., :, None, :] + (k @ w_k.T)[..., None, :, :]
    return torch.tanh(hidden).sum(-1)


# ------------------------------------------------------------------- local


def my_local_alignment(scores, centre, half_width):
    """Local-p: softmax over the window |l - p| <= D, times a Gaussian (sigma D/2)."""
    dist = torch.arange(scores.shape[-1]) - centre[:, None]
    inside = dist.abs() <= half_width
    w = torch.softmax(scores.masked_fill(~inside, float("-inf")), -1)
    return w * torch.exp(-(dist**2) / (2 * (half_width / 2) ** 2))


def my_local_alignment_stub(scores, centre, half_width):
    """Local-p: softmax over the window |l - p| <= D, times a Gaussian (sigma D/2)."""
    raise NotImplementedError("write your solution here")


def local_with_a_global_softmax(scores, centre, half_width):
    dist = torch.arange(scores.shape[-1]) - centre[:, None]
    inside = dist.abs() <= half_width
    gauss = torch.exp(-(dist**2) / (2 * (half_width / 2) ** 2))
    return torch.softmax(scores, -1) * inside * gauss


def local_without_the_gaussian(scores, centre, half_width):
    dist = torch.arange(scores.shape[-1]) - centre[:, None]
    inside = dist.abs() <= half_width
    return torch.softmax(scores.masked_fill(~inside, float("-inf")), -1)


ROWS = [
    Row(
        ch09.check_cosine_scores,
        my_cosine_scores,
        my_cosine_scores_stub,
        (
            (cosine_without_normalising, "plain dot product"),
            (cosine_normalising_the_queries_only, "only the queries are normalised"),
        ),
    ),
    Row(
        ch09.check_additive_scores,
        my_additive_scores,
        my_additive_scores_stub,
        (
            (additive_without_tanh, "the tanh is missing"),
            (additive_summing_the_hidden_units, "the hidden units are summed"),
        ),
    ),
    Row(
        ch09.check_local_alignment,
        my_local_alignment,
        my_local_alignment_stub,
        (
            (local_with_a_global_softmax, "the softmax runs over every key"),
            (local_without_the_gaussian, "the Gaussian factor is missing"),
        ),
    ),
]
