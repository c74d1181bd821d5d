"""Chapter 1's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import torch
import torch.nn.functional as F

from attention.exercises import ch01
from exercise_rows import Row


def my_scores(q, k):
    """The (n, m) matrix of dot products q_i . k_j, from two loops."""
    scores = torch.zeros(q.shape[0], k.shape[0], dtype=q.dtype)
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            scores[i, j] = (q[i] * k[j]).sum()
    return scores


def my_scores_stub(q, k):
    """The (n, m) matrix of dot products q_i . k_j, from two loops."""
    raise NotImplementedError("write your solution here")


def scores_with_rows_and_columns_swapped(q, k):
    return k @ q.T


def scores_without_transposing_the_key(q, k):
    return q @ k


def scores_divided_by_sqrt_d(q, k):
    return q @ k.T / q.shape[-1] ** 0.5


def scores_in_float32(q, k):
    scores = torch.zeros(q.shape[0], k.shape[0])
    for i in range(q.shape[0]):
        for j in range(k.shape[0]):
            scores[i, j] = q[i] @ k[j]
    return scores


def my_cosine(q, k):
    """The (n, m) matrix of cosines between queries and keys."""
    q_unit = q / q.norm(dim=-1, keepdim=True)
    k_unit = k / k.norm(dim=-1, keepdim=True)
    return q_unit @ k_unit.T


def my_cosine_stub(q, k):
    """The (n, m) matrix of cosines between queries and keys."""
    raise NotImplementedError("write your solution here")


def cosine_of_normalised_queries_only(q, k):
    return (q / q.norm(dim=-1, keepdim=True)) @ k.T


def cosine_normalised_along_the_wrong_axis(q, k):
    return (q / q.norm(dim=0)) @ (k / k.norm(dim=0)).T


def cosine_that_is_a_dot_product(q, k):
    return q @ k.T


def cosine_with_torch_but_unbroadcast(q, k):
    return F.cosine_similarity(q, k, dim=-1)


def my_angle(a, b):
    """The angle between a and b, in radians, one per pair along the last axis."""
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    return torch.arccos(cos.clamp(-1.0, 1.0))


def my_angle_stub(a, b):
    """The angle between a and b, in radians, one per pair along the last axis."""
    raise NotImplementedError("write your solution here")


def angle_without_clamping(a, b):
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    return torch.arccos(cos)


def angle_with_torch_cosine_unclamped(a, b):
    return torch.arccos(F.cosine_similarity(a, b, dim=-1, eps=0.0))


def angle_in_degrees(a, b):
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    return torch.rad2deg(torch.arccos(cos.clamp(-1.0, 1.0)))


def angle_from_the_raw_dot_product(a, b):
    return torch.arccos((a * b).sum(-1).clamp(-1, 1))


ROWS = [
    Row(
        ch01.check_score_matrix,
        my_scores,
        my_scores_stub,
        (
            (scores_with_rows_and_columns_swapped, "rows and columns are swapped"),
            (scores_without_transposing_the_key, "the key is not transposed"),
            (scores_divided_by_sqrt_d, "divided by sqrt(d)"),
            (scores_in_float32, "with dtype torch.float32"),
        ),
    ),
    Row(
        ch01.check_cosine_similarity,
        my_cosine,
        my_cosine_stub,
        (
            (cosine_of_normalised_queries_only, "only the queries"),
            (cosine_normalised_along_the_wrong_axis, "along the wrong axis"),
            (cosine_that_is_a_dot_product, "these are dot products, not cosines"),
            (cosine_with_torch_but_unbroadcast, "F.cosine_similarity pairs rows up"),
        ),
    ),
    Row(
        ch01.check_angle,
        my_angle,
        my_angle_stub,
        (
            (angle_without_clamping, "clamp the cosine to [-1, 1]"),
            (angle_in_degrees, "the angle is in degrees"),
            (angle_from_the_raw_dot_product, "not divided by the two lengths"),
        ),
    ),
]
