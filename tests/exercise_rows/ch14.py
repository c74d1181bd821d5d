"""Chapter 14's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch

from attention.exercises import ch14
from exercise_rows import Row

# --------------------------------------------------------------------------- one tile


def my_step(m, l, acc, scores, v):  # noqa: E741
    """Fold one block of scores and values into the running m, l and acc."""
    m_new = torch.maximum(m, scores.amax(-1))
    shift = torch.where(m_new.isneginf(), 0.0, m_new)
    alpha = torch.exp(m - shift)
    p = torch.exp(scores - shift[..., None])
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v


def my_step_stub(m, l, acc, scores, v):  # noqa: E741
    """Fold one block of scores and values into the running m, l and acc."""
    raise NotImplementedError("write your solution here")


def step_forgetting_acc(m, l, acc, scores, v):  # noqa: E741
    m_new = torch.maximum(m, scores.amax(-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[..., None])
    return m_new, l * alpha + p.sum(-1), acc + p @ v


def step_dividing_early(m, l, acc, scores, v):  # noqa: E741
    m_new = torch.maximum(m, scores.amax(-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[..., None])
    l_new = l * alpha + p.sum(-1)
    return m_new, l_new, (acc * alpha[..., None] + p @ v) / l_new[..., None]


def step_without_shift(m, l, acc, scores, v):  # noqa: E741
    m_new = torch.maximum(m, scores.amax(-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores)
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v


def step_returning_the_output(m, l, acc, scores, v):  # noqa: E741
    m_new, l_new, acc_new = my_step(m, l, acc, scores, v)
    return acc_new / l_new[..., None]


# --------------------------------------------------------------------------- the loop


def my_tiled_attention(q, k, v, block_size):
    """Exact attention, one block of keys at a time, never the whole (i, j) matrix."""
    scale = 1 / math.sqrt(q.shape[-1])
    m = torch.full(q.shape[:-1], -torch.inf, dtype=q.dtype)
    l = torch.zeros(q.shape[:-1], dtype=q.dtype)  # noqa: E741
    acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for j0 in range(0, k.shape[-2], block_size):
        s = q @ k[..., j0 : j0 + block_size, :].transpose(-2, -1) * scale
        m_new = torch.maximum(m, s.amax(-1))
        alpha, p = torch.exp(m - m_new), torch.exp(s - m_new[..., None])
        l = l * alpha + p.sum(-1)  # noqa: E741
        acc = acc * alpha[..., None] + p @ v[..., j0 : j0 + block_size, :]
        m = m_new
    return acc / l[..., None]


def my_tiled_attention_stub(q, k, v, block_size):
    """Exact attention, one block of keys at a time, never the whole (i, j) matrix."""
    raise NotImplementedError("write your solution here")


def attention_all_at_once(q, k, v, block_size):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, -1) @ v


def tiled_without_scale(q, k, v, block_size):
    return my_tiled_attention(q * math.sqrt(q.shape[-1]), k, v, block_size)


def tiled_skipping_the_last_block(q, k, v, block_size):
    whole = k.shape[-2] // block_size * block_size
    return my_tiled_attention(q, k[..., :whole, :], v[..., :whole, :], block_size)


def tiled_with_a_softmax_per_block(q, k, v, block_size):
    out = 0
    for j0 in range(0, k.shape[-2], block_size):
        s = q @ k[..., j0 : j0 + block_size, :].transpose(-2, -1)
        s = s / math.sqrt(q.shape[-1])
        out = out + torch.softmax(s, -1) @ v[..., j0 : j0 + block_size, :]
    return out


# --------------------------------------------------------------------------- lse


def my_logsumexp(x):
    """log(sum(exp(x))) along the last axis, stably; -inf for a row of -inf."""
    m = x.amax(-1, keepdim=True)
    m = torch.where(m.isneginf(), 0.0, m)
    return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)


def my_logsumexp_stub(x):
    """log(sum(exp(x))) along the last axis, stably; -inf for a row of -inf."""
    raise NotImplementedError("write your solution here")


def lse_straight_from_the_formula(x):
    return torch.log(torch.exp(x).sum(-1))


def lse_shifted_by_the_global_max(x):
    m = x.max()
    return m + torch.log(torch.exp(x - m).sum(-1))


def lse_nan_for_a_dead_row(x):
    m = x.amax(-1, keepdim=True)
    return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))).squeeze(-1)


def lse_forgetting_the_shift(x):
    m = x.amax(-1, keepdim=True)
    return torch.log(torch.exp(x - m).sum(-1))


ROWS = [
    Row(
        ch14.check_online_attention_step,
        my_step,
        my_step_stub,
        (
            (step_forgetting_acc, "the accumulator is not rescaled"),
            (step_dividing_early, "divided by the sum too early"),
            (step_without_shift, "not shifted"),
            (step_returning_the_output, "expected a tuple of 3"),
        ),
    ),
    Row(
        ch14.check_tiled_attention,
        my_tiled_attention,
        my_tiled_attention_stub,
        (
            (attention_all_at_once, "built the whole (6, 20) matrix"),
            (tiled_without_scale, "not scaled"),
            (tiled_skipping_the_last_block, "the last, shorter block is dropped"),
            (tiled_with_a_softmax_per_block, "each block is normalised on its own"),
        ),
    ),
    Row(
        ch14.check_logsumexp,
        my_logsumexp,
        my_logsumexp_stub,
        (
            (lse_straight_from_the_formula, "no shift"),
            (lse_shifted_by_the_global_max, "one shift for the whole tensor"),
            (lse_nan_for_a_dead_row, "must give -inf, not NaN"),
            (lse_forgetting_the_shift, "the shift is not added back"),
        ),
    ),
]
