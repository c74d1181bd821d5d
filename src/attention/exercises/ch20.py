"""Checkers for chapter 20's exercises: sparsemax from its threshold, sigmoid attention
and differential attention.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch20
    ch20.check_sparsemax(my_sparsemax)

Every input is float64; the tolerance is stated in the ``✓`` line. Shape legend: ``n``
scores in a row, ``i`` queries, ``j`` keys, ``d`` query/key size, ``e`` value size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..reading.weights import differential_attention, sigmoid_attention, sparsemax
from ._checker import Case, Mistake, Property, check, randn, random_qkv

__all__ = [
    "check_sparsemax",
    "check_sigmoid_attention",
    "check_differential_attention",
]


# ---------------------------------------------------------------------- sparsemax


def _sparsemax(z):
    """The reference: the package's sparsemax over the last axis."""
    return sparsemax(z, dim=-1)


def _threshold(ordered: Tensor, kept: Tensor, *, minus: float = 1.0) -> Tensor:
    """``(sum of the first ``kept`` entries of ``ordered`` - minus) / kept``."""
    cumulative = ordered.cumsum(-1)
    index = (kept - 1).clamp(0, ordered.shape[-1] - 1)
    return (cumulative.gather(-1, index) - minus) / kept


def _support(ordered: Tensor, start: int = 1) -> Tensor:
    """How many sorted entries pass ``1 + k z_(k) > z_(1) + ... + z_(k)``."""
    n = ordered.shape[-1]
    k = torch.arange(start, start + n, dtype=ordered.dtype)
    return (1 + k * ordered > ordered.cumsum(-1)).sum(-1, keepdim=True)


def _sorted(z):
    return torch.sort(z, dim=-1, descending=True).values


def _unsorted_support(z):
    kept = _support(z)  # the test and the sums run on the row as it comes
    return torch.clamp(z - _threshold(z, kept), min=0)


def _one_score_too_many(z):
    ordered = _sorted(z)
    kept = _support(ordered)
    # cumsum[..., K] holds K + 1 scores (0-based), divided by K
    index = kept.clamp(max=z.shape[-1] - 1)
    tau = (ordered.cumsum(-1).gather(-1, index) - 1) / kept
    return torch.clamp(z - tau, min=0)


def _k_from_zero(z):
    ordered = _sorted(z)
    kept = _support(ordered, start=0).clamp(min=1)
    return torch.clamp(z - _threshold(ordered, kept), min=0)


def _without_the_one(z):
    ordered = _sorted(z)
    return torch.clamp(z - _threshold(ordered, _support(ordered), minus=0.0), min=0)


def _softmax_instead(z):
    return torch.softmax(z, dim=-1)


def _sums_to_one(out, z):
    return (out.sum(-1) - 1).abs() <= 1e-9


def _non_negative(out, z):
    return out >= 0


def _sparsemax_cases() -> list[Case]:
    lead = torch.tensor([2.5, 0.4, 1.2, -0.3, 0.9], dtype=torch.float64)
    return [
        Case("one row of 6 scores", (randn(6, seed=40, scale=1.2),)),
        Case("4 rows of 7 scores, spread 2", (randn(4, 7, seed=41, scale=2.0),)),
        Case("a batch (2, 3, 5)", (randn(2, 3, 5, seed=42),)),
        Case("a row whose top score leads by more than 1", (lead,)),
        Case("a row of equal scores", (torch.full((4,), 0.7, dtype=torch.float64),)),
    ]


def check_sparsemax(fn) -> None:
    r"""Check ``fn(z)``: sparsemax over the last axis, from its threshold.

    .. math:: \operatorname{sparsemax}(z) = [z - \tau]_+, \qquad
        \tau = \frac{z_{(1)} + \dots + z_{(K)} - 1}{K}

    with :math:`z_{(1)} \ge z_{(2)} \ge \dots` the scores sorted in decreasing order
    and :math:`K` the number of ``k`` for which
    :math:`1 + k\, z_{(k)} > z_{(1)} + \dots + z_{(k)}` (they form a prefix).

    Args of ``fn``:
        z: ``(..., n)`` scores.

    ``fn`` returns ``(..., n)``: non-negative, each row summing to 1, with exact zeros
    below the threshold. The inputs: one row, several rows, a batch, a row whose top
    score leads by more than 1 (only it is kept), a row of equal scores (all kept).
    Known mistakes are named: the support found on the unsorted row, one score too
    many in the threshold, ``k`` counted from 0, the ``- 1`` left out of the
    threshold, softmax. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_sparsemax(z):
        ...     ordered = torch.sort(z, dim=-1, descending=True).values
        ...     k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype)
        ...     cumulative = ordered.cumsum(-1)
        ...     kept = (1 + k * ordered > cumulative).sum(-1, keepdim=True)
        ...     tau = (cumulative.gather(-1, kept - 1) - 1) / kept
        ...     return torch.clamp(z - tau, min=0)
        >>> check_sparsemax(my_sparsemax)  # doctest: +ELLIPSIS
        ✓ my_sparsemax: [z - tau]_+ with tau from the sorted scores (5 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _sparsemax,
        _sparsemax_cases(),
        what="[z - tau]_+ with tau from the sorted scores",
        properties=[
            Property("every weight must be >= 0", _non_negative),
            Property("each row must sum to 1", _sums_to_one),
        ],
        mistakes=[
            Mistake(
                "the support test ran on the unsorted row: sort the scores in "
                "decreasing order first (torch.sort(z, descending=True))",
                _unsorted_support,
            ),
            Mistake(
                "the threshold sums one score too many: with K kept scores it is "
                "(cumsum[K - 1] - 1) / K in 0-based indexing",
                _one_score_too_many,
            ),
            Mistake(
                "k counts from 0 in the support test: it is 1 + k z_(k) > "
                "z_(1) + ... + z_(k) for k = 1, 2, ...",
                _k_from_zero,
            ),
            Mistake(
                "the threshold lacks the - 1: tau = (z_(1) + ... + z_(K) - 1) / K "
                "makes the kept weights sum to 1",
                _without_the_one,
            ),
            Mistake(
                "this is softmax: sparsemax subtracts a threshold and clips at 0, "
                "[z - tau]_+",
                _softmax_instead,
            ),
        ],
    )


# ----------------------------------------------------------------------- sigmoid


def _sigmoid(q, k, v):
    """The reference: the package's sigmoid attention, bias -log j."""
    return sigmoid_attention(q, k, v)


def _scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def _sigmoid_without_bias(q, k, v):
    return torch.sigmoid(_scores(q, k)) @ v


def _sigmoid_log_queries(q, k, v):
    return torch.sigmoid(_scores(q, k) - math.log(q.shape[-2])) @ v


def _sigmoid_plus_log(q, k, v):
    return torch.sigmoid(_scores(q, k) + math.log(k.shape[-2])) @ v


def _sigmoid_without_scale(q, k, v):
    return torch.sigmoid(q @ k.transpose(-2, -1) - math.log(k.shape[-2])) @ v


def _softmax_attention(q, k, v):
    return torch.softmax(_scores(q, k), dim=-1) @ v


def _sigmoid_cases() -> list[Case]:
    return [
        Case("i = 3 queries, j = 5 keys, d = 4, e = 2", random_qkv(3, 5, seed=50)),
        Case(
            "more queries than keys: i = 6, j = 2, d = 3, e = 3",
            random_qkv(6, 2, d=3, e=3, seed=51),
        ),
        Case(
            "a batch of 2 with 3 heads: (2, 3, 4, d = 4), 7 keys",
            random_qkv(4, 7, d=4, e=2, batch=(2, 3), seed=52),
        ),
    ]


def check_sigmoid_attention(fn) -> None:
    r"""Check ``fn(q, k, v)``: sigmoid attention with the bias :math:`-\log j`.

    .. math::
        o_i = \sum_j \sigma\!\Big(\frac{q_i \cdot k_j}{\sqrt d} - \log j\Big)\, v_j

    with ``j`` the number of keys.

    Args of ``fn``:
        q: ``(..., i, d)``; k: ``(..., j, d)``; v: ``(..., j, e)``.

    ``fn`` returns ``(..., i, e)``. Each key is weighted on its own, with no softmax
    over the keys. The inputs: more keys than queries, more queries than keys (so the
    two counts cannot be mixed up unseen), a batch with heads. Known mistakes are
    named: no bias, the bias from the number of queries, ``+log j``, no ``1/sqrt(d)``,
    softmax. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_sigmoid_attention(q, k, v):
        ...     scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        ...     return torch.sigmoid(scores - math.log(k.shape[-2])) @ v
        >>> check_sigmoid_attention(my_sigmoid_attention)  # doctest: +ELLIPSIS
        ✓ my_sigmoid_attention: sigmoid(q k^T / sqrt(d) - log j) v (3 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _sigmoid,
        _sigmoid_cases(),
        what="sigmoid(q k^T / sqrt(d) - log j) v",
        mistakes=[
            Mistake(
                "the bias is missing: add -log j (j the number of keys) to every "
                "score before the sigmoid",
                _sigmoid_without_bias,
            ),
            Mistake(
                "the bias uses the number of queries: it is -log j, with j the "
                "number of keys, k.shape[-2]",
                _sigmoid_log_queries,
            ),
            Mistake(
                "the bias has the wrong sign: it is -log j, which starts a row's "
                "total weight near 1",
                _sigmoid_plus_log,
            ),
            Mistake(
                "the scores are not divided by sqrt(d): scale q k^T by 1 / sqrt(d) "
                "before adding the bias",
                _sigmoid_without_scale,
            ),
            Mistake(
                "this is softmax attention: weight each key on its own with "
                "sigmoid(score - log j)",
                _softmax_attention,
            ),
        ],
    )


# ------------------------------------------------------------------ differential


def _differential(q1, q2, k1, k2, v, lam):
    """The reference: the package's differential attention."""
    return differential_attention(q1, q2, k1, k2, v, lam)


def _map(q, k):
    return torch.softmax(_scores(q, k), dim=-1)


def _lambda_on_the_first(q1, q2, k1, k2, v, lam):
    return (lam * _map(q1, k1) - _map(q2, k2)) @ v


def _lambda_left_out(q1, q2, k1, k2, v, lam):
    return (_map(q1, k1) - _map(q2, k2)) @ v


def _maps_added(q1, q2, k1, k2, v, lam):
    return (_map(q1, k1) + lam * _map(q2, k2)) @ v


def _keys_crossed(q1, q2, k1, k2, v, lam):
    return (_map(q1, k2) - lam * _map(q2, k1)) @ v


def _scores_subtracted(q1, q2, k1, k2, v, lam):
    return torch.softmax(_scores(q1, k1) - lam * _scores(q2, k2), dim=-1) @ v


def _differential_cases() -> list[Case]:
    def inputs(i, j, d, e, lam, batch=(), seed=0):
        q1, k1, v = random_qkv(i, j, d=d, e=e, batch=batch, seed=seed, scale=1.5)
        q2, k2, _ = random_qkv(i, j, d=d, e=e, batch=batch, seed=seed + 1, scale=1.5)
        return (q1, q2, k1, k2, v, lam)

    return [
        Case("i = 3, j = 5, d = 4, e = 2, lam = 0.3", inputs(3, 5, 4, 2, 0.3, seed=60)),
        Case(
            "a batch of 2 with 2 heads, i = j = 6, lam = 0.8",
            inputs(6, 6, 4, 3, 0.8, batch=(2, 2), seed=62),
        ),
        Case("lam = 0.5, one query", inputs(1, 4, 2, 2, 0.5, seed=64)),
    ]


def check_differential_attention(fn) -> None:
    r"""Check ``fn(q1, q2, k1, k2, v, lam)``: the difference of two softmax maps.

    .. math:: \Big(\operatorname{softmax}\!\Big(\frac{Q_1 K_1^\top}{\sqrt d}\Big)
        - \lambda\, \operatorname{softmax}\!\Big(\frac{Q_2 K_2^\top}{\sqrt d}\Big)
        \Big)\, V

    Args of ``fn``:
        q1, q2: ``(..., i, d)``; k1, k2: ``(..., j, d)``; v: ``(..., j, e)``;
        lam: :math:`\lambda`, a number.

    ``fn`` returns ``(..., i, e)``. Each map is an ordinary softmax attention map;
    :math:`\lambda` scales the second. The inputs: sizes that differ, a batch with
    heads, one query. Known mistakes are named: :math:`\lambda` on the first map,
    :math:`\lambda` left out, the maps added, the keys crossed, the scores subtracted
    before one softmax. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_differential_attention(q1, q2, k1, k2, v, lam):
        ...     def weights(q, k):
        ...         scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        ...         return torch.softmax(scores, dim=-1)
        ...     return (weights(q1, k1) - lam * weights(q2, k2)) @ v
        >>> check_differential_attention(my_differential_attention)
        ✓ my_differential_attention: (A1 - lam A2) V (3 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _differential,
        _differential_cases(),
        what="(A1 - lam A2) V",
        mistakes=[
            Mistake(
                "lam scales the wrong map: it multiplies the second map, "
                "A1 - lam A2, so the rows sum to 1 - lam",
                _lambda_on_the_first,
            ),
            Mistake(
                "lam is left out: the second map is scaled by lam before it is "
                "subtracted",
                _lambda_left_out,
            ),
            Mistake(
                "the maps are added: subtract lam times the second map",
                _maps_added,
            ),
            Mistake(
                "the keys are crossed: map 1 pairs q1 with k1, map 2 pairs q2 with k2",
                _keys_crossed,
            ),
            Mistake(
                "the scores are subtracted before one softmax: take two softmax "
                "maps first, then subtract lam times the second",
                _scores_subtracted,
            ),
        ],
    )
