"""Checkers for chapter 5's exercises: self-attention, the weighted sum, causal masks.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch05
    ch05.check_self_attention(my_self_attention)

Every input is float64; the tolerance is stated in the ``✓`` line. Shape legend: ``n``
tokens, ``d_in`` input features, ``d`` query/key size, ``e`` value size, ``i`` queries,
``j`` keys. Weight convention: the paper's, ``Q = X W_Q`` with ``W_Q`` of shape
``(d_in, d)``. Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..foundations.scaled_dot_product import scaled_dot_product_attention
from ._checker import Case, Mistake, Property, check, randn, random_qkv

__all__ = [
    "check_self_attention",
    "check_weighted_sum",
    "check_causal_self_attention",
]

_NOT_TRANSPOSED = "K is not transposed: the scores are q @ k.transpose(-2, -1)"
_DOT_T = (
    "k.T reverses every axis of a batched tensor: "
    "use k.transpose(-2, -1) (or k.mT) for the scores"
)


def _softmax_rows(scores: Tensor) -> Tensor:
    return torch.softmax(scores, dim=-1)


# ------------------------------------------------------------------- self-attention


def _self_attention(x, w_q, w_k, w_v):
    """The reference: the package's attention on the three projections."""
    return scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v)


def _sa_no_transpose(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return _softmax_rows(q @ k / math.sqrt(q.shape[-1])) @ v


def _sa_dot_t(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    reversed_k = k.permute(
        *reversed(range(k.dim()))
    )  # what k.T does, without a warning
    return _softmax_rows(q @ reversed_k / math.sqrt(q.shape[-1])) @ v


def _sa_no_scale(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return _softmax_rows(q @ k.transpose(-2, -1)) @ v


def _sa_input_scale(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return _softmax_rows(q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])) @ v


def _sa_query_axis(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -2) @ v


def _sa_transposed_weights(x, w_q, w_k, w_v):
    return scaled_dot_product_attention(x @ w_q.T, x @ w_k.T, x @ w_v.T)


def _sa_no_value(x, w_q, w_k, w_v):
    q, k = x @ w_q, x @ w_k
    return scaled_dot_product_attention(q, k, x)


def _self_attention_cases() -> list[Case]:
    def weights(d_in, d, e, seed):
        return (
            randn(d_in, d, seed=seed, scale=d_in**-0.5),
            randn(d_in, d, seed=seed + 1, scale=d_in**-0.5),
            randn(d_in, e, seed=seed + 2, scale=d_in**-0.5),
        )

    return [
        Case(
            "n = 5 tokens, d_in = 6, d = 4, e = 3",
            (randn(5, 6, seed=0, scale=2.0), *weights(6, 4, 3, seed=1)),
        ),
        Case(
            "a square case: n = d_in = d = e = 4",
            (randn(4, 4, seed=4, scale=2.0), *weights(4, 4, 4, seed=5)),
        ),
        Case(
            "a batch of 2 sentences: x of shape (2, 5, 6)",
            (randn(2, 5, 6, seed=8, scale=2.0), *weights(6, 4, 3, seed=9)),
        ),
    ]


def check_self_attention(fn) -> None:
    r"""Check ``fn(x, w_q, w_k, w_v)``: one head of self-attention, from its formula.

    .. math:: Z = \operatorname{softmax}\!\Big(\frac{Q K^\top}{\sqrt{d}}\Big) V, \quad
        Q = X W_Q,\ K = X W_K,\ V = X W_V

    Args of ``fn``:
        x: ``(..., n, d_in)`` the tokens, one row each (leading batch dims allowed).
        w_q, w_k: ``(d_in, d)`` the query and key projections (the paper's ``X W``).
        w_v: ``(d_in, e)`` the value projection.

    ``fn`` returns ``(..., n, e)``: one output row per token. The softmax runs along
    each query's row of scores (over the keys). The inputs: sizes that all differ (a
    key that is not transposed raises), a square case (where it runs and is wrong), a
    batch of two sentences (``k.T`` reverses every axis there). Known mistakes are
    named: K not transposed, ``.T`` on a batch, no ``1/sqrt(d)``, ``1/sqrt(d_in)``
    instead of ``1/sqrt(d)``, the softmax over the queries, the weights used as
    ``x @ w.T``, the tokens used as values. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_self_attention(x, w_q, w_k, w_v):
        ...     q, k, v = x @ w_q, x @ w_k, x @ w_v
        ...     scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        ...     return torch.softmax(scores, dim=-1) @ v
        >>> check_self_attention(my_self_attention)  # doctest: +ELLIPSIS
        ✓ my_self_attention: softmax(Q K^T / sqrt(d)) V (3 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _self_attention,
        _self_attention_cases(),
        what="softmax(Q K^T / sqrt(d)) V",
        mistakes=[
            Mistake(_NOT_TRANSPOSED, _sa_no_transpose),
            Mistake(_DOT_T, _sa_dot_t),
            Mistake(
                "the scores are not divided by sqrt(d): scale Q K^T by "
                "1 / sqrt(d) before the softmax",
                _sa_no_scale,
            ),
            Mistake(
                "the scores are divided by sqrt(d_in), the input size: divide by "
                "sqrt(d), the query/key size (w_q.shape[1])",
                _sa_input_scale,
            ),
            Mistake(
                "the softmax runs over the queries (dim=-2): each query's row of "
                "weights must sum to 1, softmax(..., dim=-1)",
                _sa_query_axis,
            ),
            Mistake(
                "the projections are (d_in, d): compute x @ w_q, not x @ w_q.T",
                _sa_transposed_weights,
            ),
            Mistake(
                "the output mixes the tokens x, not the values: multiply the "
                "weights by V = x @ w_v",
                _sa_no_value,
            ),
        ],
    )


# ---------------------------------------------------------------------- weighted sum


def _weighted_sum(weights, values):
    """The reference: z_i = sum_j weights[i, j] v_j."""
    return weights @ values


def _ws_transposed(weights, values):
    return weights.transpose(-2, -1) @ values


def _ws_plain_mean(weights, values):
    return values.mean(-2, keepdim=True).expand(*weights.shape[:-1], values.shape[-1])


def _ws_over_values(weights, values):
    return weights.sum(-1, keepdim=True) * values.sum(-2, keepdim=True)


def _within_the_values(out, weights, values):
    """Every output coordinate lies between the values' smallest and largest."""
    low = values.amin(-2, keepdim=True) - 1e-12
    high = values.amax(-2, keepdim=True) + 1e-12
    return (out >= low) & (out <= high)


def _weighted_sum_cases() -> list[Case]:
    def rows(*shape, seed):
        return torch.softmax(randn(*shape, seed=seed, scale=1.5), dim=-1)

    return [
        Case(
            "3 queries, 5 keys, e = 2",
            (rows(3, 5, seed=20), randn(5, 2, seed=21)),
        ),
        Case(
            "a square case: 4 queries, 4 keys, e = 3",
            (rows(4, 4, seed=22), randn(4, 3, seed=23)),
        ),
        Case(
            "a batch: weights (2, 3, 5), values (2, 5, 2)",
            (rows(2, 3, 5, seed=24), randn(2, 5, 2, seed=25)),
        ),
    ]


def check_weighted_sum(fn) -> None:
    r"""Check ``fn(weights, values)``: each output row as a weighted sum of value rows.

    .. math:: z_i = \sum_j A_{ij}\, v_j

    Args of ``fn``:
        weights: ``(..., i, j)`` attention weights; row ``i`` belongs to query ``i``,
            and each row is non-negative and sums to 1.
        values: ``(..., j, e)`` one value vector per key.

    ``fn`` returns ``(..., i, e)``. Write it as the sum it is (a loop over the keys, or
    broadcasting); the checker accepts any correct form. Every output coordinate must
    lie between the smallest and the largest value of that coordinate: a convex
    combination cannot leave that range. The inputs: ``i != j`` (transposed weights
    raise), a square case (where they run and are wrong), a batch. Known mistakes are
    named: the weights transposed, a plain mean of the values, a sum that drops the
    weights. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_weighted_sum(weights, values):
        ...     return (weights[..., :, :, None] * values[..., None, :, :]).sum(-2)
        >>> check_weighted_sum(my_weighted_sum)  # doctest: +ELLIPSIS
        ✓ my_weighted_sum: z_i = sum_j A[i, j] v_j (3 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _weighted_sum,
        _weighted_sum_cases(),
        what="z_i = sum_j A[i, j] v_j",
        properties=[
            Property(
                "every output coordinate must lie between the smallest and largest "
                "value of that coordinate (a convex combination)",
                _within_the_values,
            )
        ],
        mistakes=[
            Mistake(
                "the weights are transposed: row i of the weights belongs to query "
                "i, so z_i = sum_j weights[i, j] v_j",
                _ws_transposed,
            ),
            Mistake(
                "every output is the plain mean of the values: weight value j by "
                "weights[i, j]",
                _ws_plain_mean,
            ),
            Mistake(
                "the sum over the keys dropped the weights: multiply each value row "
                "v_j by its weight weights[i, j] before summing",
                _ws_over_values,
            ),
        ],
    )


# -------------------------------------------------------------- causal self-attention


def _causal(q, k, v):
    """The reference: query p sees the keys 0 ... p."""
    return scaled_dot_product_attention(q, k, v, is_causal=True)


def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def _keep(n: int, diagonal: int = 0) -> Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril(diagonal)


def _masked(scores, keep, v):
    return torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1) @ v


def _causal_inverted(q, k, v):
    return _masked(_scores(q, k), ~_keep(q.shape[-2]), v)


def _causal_no_diagonal(q, k, v):
    return _masked(_scores(q, k), _keep(q.shape[-2], -1), v)


def _causal_one_ahead(q, k, v):
    return _masked(_scores(q, k), _keep(q.shape[-2], 1), v)


def _causal_no_mask(q, k, v):
    return torch.softmax(_scores(q, k), dim=-1) @ v


def _causal_no_scale(q, k, v):
    return _masked(q @ k.transpose(-2, -1), _keep(q.shape[-2]), v)


def _causal_no_transpose(q, k, v):
    return _masked(q @ k / math.sqrt(q.shape[-1]), _keep(q.shape[-2]), v)


def _causal_after_softmax(q, k, v):
    weights = torch.softmax(_scores(q, k), dim=-1)
    return weights.masked_fill(~_keep(q.shape[-2]), 0.0) @ v


def _causal_zero_fill(q, k, v):
    keep = _keep(q.shape[-2])
    return torch.softmax(_scores(q, k).masked_fill(~keep, 0.0), dim=-1) @ v


def _causal_cases() -> list[Case]:
    return [
        Case("n = 4 tokens, d = 3, e = 2", random_qkv(4, 4, d=3, e=2, seed=30)),
        Case(
            "a square case: n = d = e = 5",
            random_qkv(5, 5, d=5, e=5, seed=31, scale=1.5),
        ),
        Case(
            "a batch of 2 sentences, 3 heads: (2, 3, 6, d = 4)",
            random_qkv(6, 6, d=4, e=3, batch=(2, 3), seed=32),
        ),
    ]


def check_causal_self_attention(fn) -> None:
    r"""Check ``fn(q, k, v)``: causal self-attention: token p sees tokens 0 ... p.

    .. math:: z_p = \sum_{t \le p} \operatorname{softmax}_t\!\Big(
        \frac{q_p \cdot k_t}{\sqrt{d}}\Big)\, v_t

    Args of ``fn``:
        q, k: ``(..., n, d)`` queries and keys of the same ``n`` tokens.
        v: ``(..., n, e)`` values.

    ``fn`` builds the causal mask itself (boolean, **True = may attend**: query ``p``
    may attend to keys ``0 ... p``), applies it to the scores before the softmax and
    returns ``(..., n, e)``. The inputs: ``n != d`` (a key that is not transposed
    raises), a square case, a batch with heads. Known mistakes are named: the mask
    inverted, the diagonal left out, one key too many, no mask, no ``1/sqrt(d)``, K not
    transposed, the mask applied to the weights after the softmax, masked scores set to
    0 instead of ``-inf``. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_causal_self_attention(q, k, v):
        ...     n = q.shape[-2]
        ...     keep = torch.ones(n, n, dtype=torch.bool).tril()
        ...     scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        ...     scores = scores.masked_fill(~keep, float("-inf"))
        ...     return torch.softmax(scores, dim=-1) @ v
        >>> check_causal_self_attention(my_causal_self_attention)  # doctest: +ELLIPSIS
        ✓ my_causal_self_attention: causal, token p sees 0 ... p (3 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _causal,
        _causal_cases(),
        what="causal, token p sees 0 ... p",
        properties=[
            Property(
                "token 0 sees only itself: its output must be its own value v_0",
                lambda out, q, k, v: (out[..., 0, :] - v[..., 0, :]).abs() <= 1e-9,
            )
        ],
        mistakes=[
            Mistake(
                "the mask looks inverted: True must mean may attend, "
                "and query p may attend to keys 0 ... p",
                _causal_inverted,
            ),
            Mistake(
                "the diagonal is missing: a token may attend to itself "
                "(tril(), not tril(-1))",
                _causal_no_diagonal,
            ),
            Mistake(
                "it is off by one: query p may see keys 0 ... p, not p + 1",
                _causal_one_ahead,
            ),
            Mistake(
                "there is no causal mask: every token sees the future",
                _causal_no_mask,
            ),
            Mistake(
                "the scores are not divided by sqrt(d): scale Q K^T by "
                "1 / sqrt(d) before the softmax",
                _causal_no_scale,
            ),
            Mistake(_NOT_TRANSPOSED, _causal_no_transpose),
            Mistake(
                "the mask is applied after the softmax: set the blocked scores to "
                "-inf before it, so each row still sums to 1",
                _causal_after_softmax,
            ),
            Mistake(
                "blocked scores are set to 0, which still gets weight: set them to "
                "-inf, so that exp gives exactly 0",
                _causal_zero_fill,
            ),
        ],
    )
