"""Chapter 20's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch20
from exercise_rows import Row

# ---------------------------------------------------------------------- sparsemax


def my_sparsemax(z):
    """Sparsemax over the last axis: [z - tau]_+, tau from the sorted scores."""
    ordered = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    cumulative = ordered.cumsum(-1)
    kept = (1 + k * ordered > cumulative).sum(-1, keepdim=True)  # K
    tau = (cumulative.gather(-1, kept - 1) - 1) / kept
    return torch.clamp(z - tau, min=0)


def my_sparsemax_stub(z):
    """Sparsemax over the last axis: [z - tau]_+, tau from the sorted scores."""
    raise NotImplementedError("write your solution here")


def sparsemax_without_sorting(z):
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    cumulative = z.cumsum(-1)
    kept = (1 + k * z > cumulative).sum(-1, keepdim=True)
    tau = (cumulative.gather(-1, kept - 1) - 1) / kept
    return torch.clamp(z - tau, min=0)


def sparsemax_with_one_score_too_many(z):
    ordered = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    cumulative = ordered.cumsum(-1)
    kept = (1 + k * ordered > cumulative).sum(-1, keepdim=True)
    index = kept.clamp(max=z.shape[-1] - 1)
    tau = (cumulative.gather(-1, index) - 1) / kept
    return torch.clamp(z - tau, min=0)


def sparsemax_counting_from_zero(z):
    ordered = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(z.shape[-1], dtype=z.dtype)
    cumulative = ordered.cumsum(-1)
    kept = (1 + k * ordered > cumulative).sum(-1, keepdim=True).clamp(min=1)
    tau = (cumulative.gather(-1, kept - 1) - 1) / kept
    return torch.clamp(z - tau, min=0)


def sparsemax_without_the_minus_one(z):
    ordered = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    cumulative = ordered.cumsum(-1)
    kept = (1 + k * ordered > cumulative).sum(-1, keepdim=True)
    tau = cumulative.gather(-1, kept - 1) / kept
    return torch.clamp(z - tau, min=0)


def sparsemax_as_softmax(z):
    return torch.softmax(z, dim=-1)


# ------------------------------------------------------------------------ sigmoid


def my_sigmoid_attention(q, k, v):
    """Sigmoid attention: each key weighted by sigmoid(score - log j)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.sigmoid(scores - math.log(k.shape[-2])) @ v


def my_sigmoid_attention_stub(q, k, v):
    """Sigmoid attention: each key weighted by sigmoid(score - log j)."""
    raise NotImplementedError("write your solution here")


def sigmoid_attention_without_bias(q, k, v):
    return torch.sigmoid(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])) @ v


def sigmoid_attention_with_the_query_count(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.sigmoid(scores - math.log(q.shape[-2])) @ v


def sigmoid_attention_plus_log(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.sigmoid(scores + math.log(k.shape[-2])) @ v


def sigmoid_attention_as_softmax(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


# ------------------------------------------------------------------- differential


def my_differential_attention(q1, q2, k1, k2, v, lam):
    """(softmax(Q1 K1^T / sqrt(d)) - lam softmax(Q2 K2^T / sqrt(d))) V."""

    def weights(q, k):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1)

    return (weights(q1, k1) - lam * weights(q2, k2)) @ v


def my_differential_attention_stub(q1, q2, k1, k2, v, lam):
    """(softmax(Q1 K1^T / sqrt(d)) - lam softmax(Q2 K2^T / sqrt(d))) V."""
    raise NotImplementedError("write your solution here")


def _weights(q, k):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)


def differential_with_lambda_on_the_first_map(q1, q2, k1, k2, v, lam):
    return (lam * _weights(q1, k1) - _weights(q2, k2)) @ v


def differential_without_lambda(q1, q2, k1, k2, v, lam):
    return (_weights(q1, k1) - _weights(q2, k2)) @ v


def differential_with_crossed_keys(q1, q2, k1, k2, v, lam):
    return (_weights(q1, k2) - lam * _weights(q2, k1)) @ v


def differential_of_the_scores(q1, q2, k1, k2, v, lam):
    s1 = q1 @ k1.transpose(-2, -1) / math.sqrt(q1.shape[-1])
    s2 = q2 @ k2.transpose(-2, -1) / math.sqrt(q2.shape[-1])
    return torch.softmax(s1 - lam * s2, dim=-1) @ v


ROWS = [
    Row(
        ch20.check_sparsemax,
        my_sparsemax,
        my_sparsemax_stub,
        (
            (sparsemax_without_sorting, "the unsorted row"),
            (sparsemax_with_one_score_too_many, "one score too many"),
            (sparsemax_counting_from_zero, "k counts from 0"),
            (sparsemax_without_the_minus_one, "lacks the - 1"),
            (sparsemax_as_softmax, "this is softmax"),
        ),
    ),
    Row(
        ch20.check_sigmoid_attention,
        my_sigmoid_attention,
        my_sigmoid_attention_stub,
        (
            (sigmoid_attention_without_bias, "the bias is missing"),
            (sigmoid_attention_with_the_query_count, "the number of queries"),
            (sigmoid_attention_plus_log, "the wrong sign"),
            (sigmoid_attention_as_softmax, "this is softmax attention"),
        ),
    ),
    Row(
        ch20.check_differential_attention,
        my_differential_attention,
        my_differential_attention_stub,
        (
            (differential_with_lambda_on_the_first_map, "lam scales the wrong map"),
            (differential_without_lambda, "lam is left out"),
            (differential_with_crossed_keys, "the keys are crossed"),
            (differential_of_the_scores, "subtracted before one softmax"),
        ),
    ),
]
