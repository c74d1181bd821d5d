"""Checkers for chapter 17's exercises: a pretrained layer's attention weights rebuilt
from its projections, the entropy of each attention row, and the weight on a sink.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch17
    ch17.check_head_weights(my_head_weights)

The inputs are small and random, in float64, shaped like the model's: ``x`` is
``(n, d_model)``, a projection weight ``(d_model, d_model)`` stored as ``nn.Linear``
stores it, ``(out_features, in_features)``. Shape legend: ``h`` heads, ``i`` queries,
``j`` keys, ``n`` tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..foundations.scaled_dot_product import attention_weights
from ..foundations.softmax import entropy
from ..layers.multihead import split_heads
from ..practice.head_stats import sink_share
from ._checker import Case, Mistake, Property, check, randn

__all__ = ["check_head_weights", "check_row_entropy", "check_sink_share"]

# --------------------------------------------------------------------------- weights


def _head_weights(x, w_q, b_q, w_k, b_k, num_heads):
    """The reference: BERT's per-head weights, through the package's own functions."""
    q = split_heads((x @ w_q.T + b_q)[None], num_heads)[0]  # (h, n, d)
    k = split_heads((x @ w_k.T + b_k)[None], num_heads)[0]  # (h, n, d)
    return attention_weights(q, k)  # (h, n, n), scale 1/sqrt(d)


def _heads(t: Tensor, num_heads: int) -> Tensor:
    n, width = t.shape
    return t.view(n, num_heads, width // num_heads).transpose(0, 1)  # (h, n, d)


def _qk(x, w_q, b_q, w_k, b_k, num_heads):
    return _heads(x @ w_q.T + b_q, num_heads), _heads(x @ w_k.T + b_k, num_heads)


def _no_scale(x, w_q, b_q, w_k, b_k, num_heads):
    q, k = _qk(x, w_q, b_q, w_k, b_k, num_heads)
    return torch.softmax(q @ k.transpose(-2, -1), -1)


def _model_width_scale(x, w_q, b_q, w_k, b_k, num_heads):
    q, k = _qk(x, w_q, b_q, w_k, b_k, num_heads)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1]), -1)


def _k_not_transposed(x, w_q, b_q, w_k, b_k, num_heads):
    q, k = _qk(x, w_q, b_q, w_k, b_k, num_heads)
    return torch.softmax(q @ k / math.sqrt(q.shape[-1]), -1)


def _weights_not_transposed(x, w_q, b_q, w_k, b_k, num_heads):
    q, k = _heads(x @ w_q + b_q, num_heads), _heads(x @ w_k + b_k, num_heads)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)


def _heads_by_reshape(x, w_q, b_q, w_k, b_k, num_heads):
    n, width = x.shape[0], w_q.shape[0]
    d = width // num_heads
    q, k = ((x @ w.T + b).reshape(num_heads, n, d) for w, b in ((w_q, b_q), (w_k, b_k)))
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d), -1)


def _over_queries(x, w_q, b_q, w_k, b_k, num_heads):
    q, k = _qk(x, w_q, b_q, w_k, b_k, num_heads)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -2)


def _projections(n: int, d_model: int, num_heads: int, seed: int) -> Case:
    x = randn(n, d_model, seed=seed)
    w_q, w_k = (randn(d_model, d_model, seed=seed + s, scale=0.8) for s in (1, 2))
    b_q, b_k = (randn(d_model, seed=seed + s, scale=0.3) for s in (3, 4))
    d = d_model // num_heads
    name = f"{n} tokens, d_model = {d_model}, {num_heads} heads of {d}"
    return Case(name, (x, w_q, b_q, w_k, b_k, num_heads))


def check_head_weights(fn) -> None:
    r"""Check ``fn(x, w_q, b_q, w_k, b_k, num_heads)``: every head's attention weights.

    As a BERT layer computes them (and ``output_attentions`` returns them):

    .. math:: Q = x W_Q^\top + b_Q, \quad K = x W_K^\top + b_K, \quad
        A_h = \operatorname{softmax}\Big(\frac{Q_h K_h^\top}{\sqrt d}\Big)

    where ``Q_h`` is columns ``h*d ... h*d + d - 1`` of ``Q`` and
    ``d = d_model / num_heads`` is the head size.

    Args of ``fn``:
        x: ``(n, d_model)`` the layer's input, one row per token.
        w_q, w_k: ``(d_model, d_model)`` the query and key weights, stored as
            ``nn.Linear.weight``: ``(out_features, in_features)``.
        b_q, b_k: ``(d_model,)`` their biases.
        num_heads: ``h``, a divisor of ``d_model``.

    ``fn`` returns ``(h, n, n)``: row ``i`` of head ``h`` is query ``i``'s weights over
    the keys. Known mistakes are named: no ``1/sqrt(d)``, the scale of the model width
    instead of the head size, K not transposed, the weight matrices used untransposed,
    heads cut by a plain reshape, the softmax over the queries. Tolerance: 1e-10.

    Example:
        >>> def my_head_weights(x, w_q, b_q, w_k, b_k, num_heads):
        ...     n, width = x.shape[0], w_q.shape[0]
        ...     q = (x @ w_q.T + b_q).view(n, num_heads, -1).transpose(0, 1)
        ...     k = (x @ w_k.T + b_k).view(n, num_heads, -1).transpose(0, 1)
        ...     s = q @ k.transpose(-2, -1) / (width // num_heads) ** 0.5
        ...     return torch.softmax(s, dim=-1)
        >>> check_head_weights(my_head_weights)  # doctest: +ELLIPSIS
        ✓ my_head_weights: every head's weights ... (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _head_weights,
        [
            _projections(5, 8, 2, seed=0),
            _projections(4, 8, 2, seed=10),
            _projections(7, 6, 3, seed=20),
            _projections(3, 6, 1, seed=30),
        ],
        what="every head's weights from the projections",
        properties=[
            Property(
                "each row (one query over the keys) must sum to 1",
                lambda out, *_: (out.sum(-1) - 1).abs() <= 1e-9,
            )
        ],
        mistakes=[
            Mistake(
                "the scale is missing: divide the scores by sqrt(d), d the head size",
                _no_scale,
            ),
            Mistake(
                "the scale uses the model width: divide by sqrt(d) with d = "
                "d_model / num_heads, the head size",
                _model_width_scale,
            ),
            Mistake(
                "K is not transposed: the scores are Q_h @ K_h.transpose(-2, -1)",
                _k_not_transposed,
            ),
            Mistake(
                "nn.Linear stores its weight as (out, in): project with "
                "x @ w.T + b, not x @ w + b",
                _weights_not_transposed,
            ),
            Mistake(
                "the heads are cut by a plain reshape to (h, n, d), which mixes "
                "tokens and heads: view as (n, h, d), then transpose(0, 1)",
                _heads_by_reshape,
            ),
            Mistake(
                "the softmax runs over the queries: normalise each row over the "
                "keys (dim=-1)",
                _over_queries,
            ),
        ],
    )


# --------------------------------------------------------------------------- entropy


def _rows(*shape: int, seed: int, scale: float = 1.0) -> Tensor:
    return torch.softmax(randn(*shape, seed=seed, scale=scale), dim=-1)


def _entropy_bits(weights):
    return entropy(weights) / math.log(2)


def _entropy_by_log_n(weights):
    return entropy(weights) / math.log(weights.shape[-1])


def _entropy_over_queries(weights):
    return entropy(weights, dim=-2)


def _entropy_without_minus(weights):
    return -entropy(weights)


def _entropy_mean(weights):
    return entropy(weights) / weights.shape[-1]


def check_row_entropy(fn) -> None:
    r"""Check ``fn(weights)``: the entropy, in nats, of every attention row.

    .. math:: H_i = -\sum_j A_{ij} \log A_{ij}, \qquad 0 \log 0 = 0

    0 when query ``i`` puts all its weight on one key, :math:`\log n` when it spreads
    it evenly over ``n`` keys.

    ``fn`` takes ``weights`` of shape ``(..., i, j)`` (rows over the keys, each summing
    to 1; any leading dims, e.g. ``(layers, heads)``) and returns ``(..., i)`` of the
    same dtype. The inputs: random rows; uniform rows; one-hot rows and rows with
    masked (zero) keys, where ``0 * log 0`` is NaN in floating point and must count as
    0; batch dims; non-square maps. Known mistakes are named: bits instead of nats,
    divided by ``log n``, over the wrong axis, a missing minus sign, a mean instead of
    a sum. Tolerance: 1e-10.

    Example:
        >>> def my_row_entropy(weights):
        ...     logs = torch.where(weights > 0, weights.log(), 0.0)
        ...     return -(weights * logs).sum(-1)
        >>> check_row_entropy(my_row_entropy)  # doctest: +ELLIPSIS
        ✓ my_row_entropy: entropy of each row ... (5 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    zero_hint = "0 * log 0 is NaN: a weight of exactly 0 must add 0 (use torch.where)"
    one_hot = torch.eye(4, 6, dtype=torch.float64)
    masked = _rows(3, 6, seed=2) * torch.tensor(
        [1.0, 1, 0, 1, 0, 1], dtype=torch.float64
    )
    masked = masked / masked.sum(-1, keepdim=True)
    check(
        fn,
        entropy,
        [
            Case("3 queries over 5 keys", (_rows(3, 5, seed=0),)),
            Case(
                "uniform rows of 4 keys",
                (torch.full((2, 4), 0.25, dtype=torch.float64),),
            ),
            Case("one-hot rows (weights of exactly 0)", (one_hot,), hint=zero_hint),
            Case("rows with two masked keys (weight 0)", (masked,), hint=zero_hint),
            Case(
                "batch dims (2, 3) of 4 x 4 maps",
                (_rows(2, 3, 4, 4, seed=1, scale=2.0),),
            ),
        ],
        what="entropy of each row in nats, 0 log 0 = 0",
        properties=[
            Property(
                "an entropy is never negative",
                lambda out, *_: out >= -1e-12,
            )
        ],
        mistakes=[
            Mistake(
                "this is the entropy in bits (log2): the chapter uses nats, torch.log",
                _entropy_bits,
            ),
            Mistake(
                "the entropy is divided by log n: return H itself (the chapter "
                "divides afterwards)",
                _entropy_by_log_n,
            ),
            Mistake(
                "the sum runs over the queries: sum over the keys, the last axis",
                _entropy_over_queries,
            ),
            Mistake(
                "the minus sign is missing: H = -sum A log A", _entropy_without_minus
            ),
            Mistake("this is a mean over the keys: H is the sum", _entropy_mean),
        ],
    )


# --------------------------------------------------------------------------- sinks


def _rows_not_columns(weights, keys):
    return weights[..., keys, :].sum(-2).mean(-1)


def _sum_over_queries(weights, keys):
    return weights[..., keys].sum(-1).sum(-1)


def _mean_over_keys(weights, keys):
    return weights[..., keys].mean(-1).mean(-1)


def _first_key_only(weights, keys):
    return weights[..., keys[0]].mean(-1)


def _largest_weight(weights, keys):
    return weights[..., keys].sum(-1).amax(-1)


def check_sink_share(fn) -> None:
    r"""Check ``fn(weights, keys)``: the weight the queries park on some key positions.

    .. math:: s = \frac1n \sum_i \sum_{j \in \text{keys}} A_{ij}

    the mean over the ``n`` queries of the weight that lands on the given keys (e.g.
    ``keys = [0]`` for ``[CLS]``). A uniform row gives each key ``1/n``.

    ``fn`` takes ``weights`` of shape ``(..., i, j)`` (each row over the keys sums to 1;
    any leading dims, e.g. ``(layers, heads)``) and ``keys``, a list of key positions,
    and returns ``(...)`` of the same dtype. The inputs: one key; two keys (``[CLS]``
    and ``[SEP]``); batch dims; more keys than queries. Known mistakes are named: rows
    instead of columns, a sum over the queries instead of a mean, a mean over the given
    keys instead of a sum, only the first key used, the largest weight instead of the
    mean. Tolerance: 1e-10.

    Example:
        >>> def my_sink_share(weights, keys):
        ...     return weights[..., keys].sum(-1).mean(-1)
        >>> check_sink_share(my_sink_share)  # doctest: +ELLIPSIS
        ✓ my_sink_share: mean weight the queries put on keys (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        sink_share,
        [
            Case("5 queries over 5 keys, keys = [0]", (_rows(5, 5, seed=3), [0])),
            Case("6 x 6, keys = [0, 5]", (_rows(6, 6, seed=4, scale=2.0), [0, 5])),
            Case(
                "batch dims (2, 3), keys = [0, 4]", (_rows(2, 3, 5, 5, seed=5), [0, 4])
            ),
            Case("4 queries over 7 keys, keys = [0, 6]", (_rows(4, 7, seed=6), [0, 6])),
        ],
        what="mean weight the queries put on keys",
        properties=[
            Property(
                "a share of weight lies in [0, 1]",
                lambda out, *_: (out >= -1e-12) & (out <= 1 + 1e-12),
            )
        ],
        mistakes=[
            Mistake(
                "this reads rows (what the key positions look at): the sink receives, "
                "so read the columns weights[..., keys]",
                _rows_not_columns,
            ),
            Mistake(
                "the weights are summed over the queries: take their mean",
                _sum_over_queries,
            ),
            Mistake(
                "the given keys are averaged: add their weights, then average over "
                "the queries",
                _mean_over_keys,
            ),
            Mistake(
                "only the first key is counted: add every key in keys", _first_key_only
            ),
            Mistake(
                "this is the largest weight over the queries: take the mean",
                _largest_weight,
            ),
        ],
    )
