"""Chapter 17's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch17
from exercise_rows import Row

# --------------------------------------------------------------------------- weights


def my_head_weights(x, w_q, b_q, w_k, b_k, num_heads):
    """Every head's attention weights (h, n, n) from a BERT layer's projections."""
    n, width = x.shape[0], w_q.shape[0]
    d = width // num_heads
    q = (x @ w_q.T + b_q).view(n, num_heads, d).transpose(0, 1)  # (h, n, d)
    k = (x @ w_k.T + b_k).view(n, num_heads, d).transpose(0, 1)  # (h, n, d)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)


def my_head_weights_stub(x, w_q, b_q, w_k, b_k, num_heads):
    """Every head's attention weights (h, n, n) from a BERT layer's projections."""
    raise NotImplementedError("write your solution here")


def _split(t, num_heads):
    n, width = t.shape
    return t.view(n, num_heads, width // num_heads).transpose(0, 1)


def weights_without_the_scale(x, w_q, b_q, w_k, b_k, num_heads):
    q, k = _split(x @ w_q.T + b_q, num_heads), _split(x @ w_k.T + b_k, num_heads)
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1)


def weights_with_k_not_transposed(x, w_q, b_q, w_k, b_k, num_heads):
    q, k = _split(x @ w_q.T + b_q, num_heads), _split(x @ w_k.T + b_k, num_heads)
    return torch.softmax(q @ k / math.sqrt(q.shape[-1]), dim=-1)


def weights_from_untransposed_linear(x, w_q, b_q, w_k, b_k, num_heads):
    q, k = _split(x @ w_q + b_q, num_heads), _split(x @ w_k + b_k, num_heads)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)


def weights_scaled_by_the_model_width(x, w_q, b_q, w_k, b_k, num_heads):
    q, k = _split(x @ w_q.T + b_q, num_heads), _split(x @ w_k.T + b_k, num_heads)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(x.shape[1]), dim=-1)


def weights_with_heads_by_reshape(x, w_q, b_q, w_k, b_k, num_heads):
    n, d = x.shape[0], w_q.shape[0] // num_heads
    q = (x @ w_q.T + b_q).reshape(num_heads, n, d)
    k = (x @ w_k.T + b_k).reshape(num_heads, n, d)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), dim=-1)


# --------------------------------------------------------------------------- entropy


def my_row_entropy(weights):
    """Entropy in nats of every attention row (..., i), with 0 log 0 = 0."""
    logs = torch.where(weights > 0, weights.log(), torch.zeros_like(weights))
    return -(weights * logs).sum(dim=-1)


def my_row_entropy_stub(weights):
    """Entropy in nats of every attention row (..., i), with 0 log 0 = 0."""
    raise NotImplementedError("write your solution here")


def entropy_with_nan_for_zeros(weights):
    return -(weights * weights.log()).sum(dim=-1)


def entropy_in_bits(weights):
    logs = torch.where(weights > 0, weights.log2(), torch.zeros_like(weights))
    return -(weights * logs).sum(dim=-1)


def entropy_over_the_queries(weights):
    logs = torch.where(weights > 0, weights.log(), torch.zeros_like(weights))
    return -(weights * logs).sum(dim=-2)


def entropy_without_the_minus(weights):
    logs = torch.where(weights > 0, weights.log(), torch.zeros_like(weights))
    return (weights * logs).sum(dim=-1)


# --------------------------------------------------------------------------- sinks


def my_sink_share(weights, keys):
    """Mean over the queries of the weight they put on the key positions keys."""
    return weights[..., keys].sum(dim=-1).mean(dim=-1)


def my_sink_share_stub(weights, keys):
    """Mean over the queries of the weight they put on the key positions keys."""
    raise NotImplementedError("write your solution here")


def share_of_the_rows(weights, keys):
    return weights[..., keys, :].sum(dim=-2).mean(dim=-1)


def share_summed_over_queries(weights, keys):
    return weights[..., keys].sum(dim=-1).sum(dim=-1)


def share_of_the_first_key(weights, keys):
    return weights[..., keys[0]].mean(dim=-1)


ROWS = [
    Row(
        ch17.check_head_weights,
        my_head_weights,
        my_head_weights_stub,
        (
            (weights_without_the_scale, "the scale is missing"),
            (weights_with_k_not_transposed, "K is not transposed"),
            (weights_from_untransposed_linear, "x @ w.T + b"),
            (weights_scaled_by_the_model_width, "uses the model width"),
            (weights_with_heads_by_reshape, "plain reshape"),
        ),
    ),
    Row(
        ch17.check_row_entropy,
        my_row_entropy,
        my_row_entropy_stub,
        (
            (entropy_with_nan_for_zeros, "0 * log 0 is NaN"),
            (entropy_in_bits, "in bits"),
            (entropy_over_the_queries, "over the queries"),
            (entropy_without_the_minus, "the minus sign is missing"),
        ),
    ),
    Row(
        ch17.check_sink_share,
        my_sink_share,
        my_sink_share_stub,
        (
            (share_of_the_rows, "read the columns"),
            (share_summed_over_queries, "summed over the queries"),
            (share_of_the_first_key, "only the first key"),
        ),
    ),
]
