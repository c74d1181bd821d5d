"""Chapter 5's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch05
from exercise_rows import Row

# --------------------------------------------------------------- self-attention


def my_self_attention(x, w_q, w_k, w_v):
    """One head of self-attention: softmax(Q K^T / sqrt(d)) V."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def my_self_attention_stub(x, w_q, w_k, w_v):
    """One head of self-attention: softmax(Q K^T / sqrt(d)) V."""
    raise NotImplementedError("write your solution here")


def attention_with_k_not_transposed(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return torch.softmax(q @ k / math.sqrt(q.shape[-1]), dim=-1) @ v


def attention_without_the_scale(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def attention_scaled_by_the_input_size(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def attention_with_dot_t(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return torch.softmax(q @ k.T / math.sqrt(q.shape[-1]), dim=-1) @ v


def attention_over_the_queries(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=0 if x.dim() == 2 else 1) @ v


# ------------------------------------------------------------------ weighted sum


def my_weighted_sum(weights, values):
    """Each output row: the values weighted by that query's row of weights."""
    return (weights[..., :, :, None] * values[..., None, :, :]).sum(-2)


def my_weighted_sum_stub(weights, values):
    """Each output row: the values weighted by that query's row of weights."""
    raise NotImplementedError("write your solution here")


def weighted_sum_by_columns(weights, values):
    return weights.transpose(-2, -1) @ values


def weighted_sum_that_forgets_the_weights(weights, values):
    mean = values.mean(-2, keepdim=True)
    return mean.expand(*weights.shape[:-1], values.shape[-1]).clone()


# ----------------------------------------------------------- causal self-attention


def my_causal_self_attention(q, k, v):
    """Causal self-attention: token p attends to tokens 0 ... p."""
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril()  # True = may attend
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def my_causal_self_attention_stub(q, k, v):
    """Causal self-attention: token p attends to tokens 0 ... p."""
    raise NotImplementedError("write your solution here")


def causal_with_the_mask_inverted(q, k, v):
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(keep, float("-inf")), dim=-1) @ v


def causal_without_the_diagonal(q, k, v):
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v


def causal_masking_the_weights(q, k, v):
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return (weights * keep) @ v


def causal_masking_with_zeros(q, k, v):
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~keep, 0.0), dim=-1) @ v


def causal_without_the_scale(q, k, v):
    n = q.shape[-2]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-2, -1)).masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


ROWS = [
    Row(
        ch05.check_self_attention,
        my_self_attention,
        my_self_attention_stub,
        (
            (attention_with_k_not_transposed, "K is not transposed"),
            (attention_without_the_scale, "not divided by sqrt(d)"),
            (attention_scaled_by_the_input_size, "divided by sqrt(d_in)"),
            (attention_with_dot_t, "k.T reverses every axis"),
            (attention_over_the_queries, "the softmax runs over the queries"),
        ),
    ),
    Row(
        ch05.check_weighted_sum,
        my_weighted_sum,
        my_weighted_sum_stub,
        (
            (weighted_sum_by_columns, "the weights are transposed"),
            (weighted_sum_that_forgets_the_weights, "plain mean of the values"),
        ),
    ),
    Row(
        ch05.check_causal_self_attention,
        my_causal_self_attention,
        my_causal_self_attention_stub,
        (
            (causal_with_the_mask_inverted, "the mask looks inverted"),
            (causal_without_the_diagonal, "the diagonal is missing"),
            (causal_masking_the_weights, "the mask is applied after the softmax"),
            (causal_masking_with_zeros, "set to 0"),
            (causal_without_the_scale, "not divided by sqrt(d)"),
        ),
    ),
]
