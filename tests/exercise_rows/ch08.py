"""Chapter 8's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import itertools
import math

import torch

from attention.exercises import ch08
from exercise_rows import Row

# --------------------------------------------------------------- cross-attention


def my_cross_attention(x_q, x_kv, w_q, w_k, w_v):
    """One head of cross-attention: queries from x_q, keys and values from x_kv."""
    q, k, v = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def my_cross_attention_stub(x_q, x_kv, w_q, w_k, w_v):
    """One head of cross-attention: queries from x_q, keys and values from x_kv."""
    raise NotImplementedError("write your solution here")


def cross_attention_with_keys_from_the_queries(x_q, x_kv, w_q, w_k, w_v):
    q, k, v = x_q @ w_q, x_q @ w_k, x_kv @ w_v
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v


def cross_attention_with_values_from_the_queries(x_q, x_kv, w_q, w_k, w_v):
    q, k, v = x_q @ w_q, x_kv @ w_k, x_q @ w_v
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v


def cross_attention_without_the_scale(x_q, x_kv, w_q, w_k, w_v):
    q, k, v = x_q @ w_q, x_kv @ w_k, x_kv @ w_v
    return torch.softmax(q @ k.transpose(-2, -1), -1) @ v


# ---------------------------------------------------------------- source padding


def my_padded_attention(q, k, v, lengths):
    """Attention over the real keys of each source (True = may attend)."""
    keep = torch.arange(k.shape[-2]) < lengths[:, None]  # (b, j)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def my_padded_attention_stub(q, k, v, lengths):
    """Attention over the real keys of each source (True = may attend)."""
    raise NotImplementedError("write your solution here")


def padded_attention_without_a_mask(q, k, v, lengths):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def padded_attention_with_the_mask_inverted(q, k, v, lengths):
    pad = torch.arange(k.shape[-2]) < lengths[:, None]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(pad[:, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def padded_attention_zeroing_after_the_softmax(q, k, v, lengths):
    keep = torch.arange(k.shape[-2]) < lengths[:, None]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return (torch.softmax(scores, dim=-1) * keep[:, None, :]) @ v


# ---------------------------------------------------------------- matching


def my_match(cost):
    """The query for each object: one to one, least total cost."""
    m, g = cost.shape
    best = min(
        itertools.permutations(range(m), g),
        key=lambda p: sum(float(cost[q, o]) for o, q in enumerate(p)),
    )
    return torch.tensor(best)


def my_match_stub(cost):
    """The query for each object: one to one, least total cost."""
    raise NotImplementedError("write your solution here")


def match_each_object_to_its_best_query(cost):
    return cost.argmin(0)


def match_greedily(cost):
    taken = []
    for o in range(cost.shape[1]):
        free = [q for q in cost[:, o].argsort().tolist() if q not in taken]
        taken.append(free[0])
    return torch.tensor(taken)


ROWS = [
    Row(
        ch08.check_cross_attention,
        my_cross_attention,
        my_cross_attention_stub,
        (
            (cross_attention_with_keys_from_the_queries, "the keys come from x_q"),
            (cross_attention_with_values_from_the_queries, "the values come from x_q"),
            (cross_attention_without_the_scale, "not divided by sqrt(d)"),
        ),
    ),
    Row(
        ch08.check_source_padding,
        my_padded_attention,
        my_padded_attention_stub,
        (
            (padded_attention_without_a_mask, "the padding is not masked"),
            (padded_attention_with_the_mask_inverted, "the mask looks inverted"),
            (padded_attention_zeroing_after_the_softmax, "zeroed after the softmax"),
        ),
    ),
    Row(
        ch08.check_match_queries,
        my_match,
        my_match_stub,
        (
            (match_each_object_to_its_best_query, "a query can serve two objects"),
            (match_greedily, "greedy choice"),
        ),
    ),
]
