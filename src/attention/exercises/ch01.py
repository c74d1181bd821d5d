"""Checkers for chapter 1's exercises: the score matrix, cosine similarity, an angle.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch01
    ch01.check_score_matrix(my_scores)

Every input is float64; the tolerance is stated in the ``✓`` line. Shape legend: ``n``
queries, ``m`` keys, ``d`` the size of a query or key.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..layers.scoring import cosine_scores, dot_scores
from ._checker import Case, Mistake, Property, check, randn

__all__ = ["check_score_matrix", "check_cosine_similarity", "check_angle"]

# ---------------------------------------------------------------------- score matrix


def _transposed_result(q, k):
    return k @ q.T


def _key_not_transposed(q, k):
    return q @ k


def _scaled(q, k):
    return q @ k.T / math.sqrt(q.shape[-1])


def _paired_rows(q, k):
    return (q * k).sum(-1)


def _score_cases() -> list[Case]:
    return [
        Case(
            "3 queries and 5 keys of size 4", (randn(3, 4, seed=0), randn(5, 4, seed=1))
        ),
        Case(
            "1 query and 6 keys of size 3", (randn(1, 3, seed=2), randn(6, 3, seed=3))
        ),
        Case(
            "4 queries and 4 keys of size 4", (randn(4, 4, seed=4), randn(4, 4, seed=5))
        ),
        Case(
            "2 queries and 3 keys of size 1", (randn(2, 1, seed=6), randn(3, 1, seed=7))
        ),
    ]


def check_score_matrix(fn) -> None:
    r"""Check ``fn(q, k)``: the ``(n, m)`` matrix of every query-key dot product.

    .. math:: S_{ij} = q_i \cdot k_j = \sum_{l=1}^{d} q_{il}\, k_{jl}

    ``q`` is ``(n, d)``, one query per row; ``k`` is ``(m, d)``, one key per row. The
    result has one row per query and one column per key, in the dtype of the inputs.
    Write it with loops, with broadcasting or with ``@``: the checker only reads the
    numbers. The inputs: ``n != m`` (a transposed result has the wrong shape), one
    query, a square case (``n = m = d``, where a key that is not transposed still
    runs), and ``d = 1``.

    Known mistakes are named: rows and columns swapped (``k @ q.T``), the key not
    transposed (``q @ k``), a ``1/sqrt(d)`` that belongs to chapter 3, and rows paired
    up instead of every query against every key. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_scores(q, k):
        ...     return q @ k.T
        >>> check_score_matrix(my_scores)  # doctest: +ELLIPSIS
        ✓ my_scores: ... (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        dot_scores,
        _score_cases(),
        what="every query against every key, S = Q Kᵀ",
        mistakes=[
            Mistake(
                "rows and columns are swapped: S[i, j] is query i against key j, "
                "so compute q @ k.T, not k @ q.T",
                _transposed_result,
            ),
            Mistake(
                "the key is not transposed: q (n, d) times k.T (d, m) gives (n, m)",
                _key_not_transposed,
            ),
            Mistake(
                "the scores are divided by sqrt(d): chapter 1's scores are plain dot "
                "products (chapter 3 adds the scale)",
                _scaled,
            ),
            Mistake(
                "query i is paired with key i only: every query must meet every key",
                _paired_rows,
            ),
        ],
    )


# ----------------------------------------------------------------- cosine similarity


def _queries_only(q, k):
    return (q / q.norm(dim=-1, keepdim=True)) @ k.T


def _keys_only(q, k):
    return q @ (k / k.norm(dim=-1, keepdim=True)).T


def _wrong_axis(q, k):
    return (q / q.norm(dim=0, keepdim=True)) @ (k / k.norm(dim=0, keepdim=True)).T


def _unbroadcast(q, k):
    return torch.nn.functional.cosine_similarity(q, k, dim=-1)


def _cosine_cases() -> list[Case]:
    lengths = torch.logspace(-2, 2, 5, dtype=torch.float64)[:, None]  # 0.01 ... 100
    return [
        Case(
            "3 queries and 5 keys of size 4",
            (randn(3, 4, seed=10), randn(5, 4, seed=11)),
        ),
        Case(
            "queries of lengths 0.01 to 100",
            (lengths * randn(5, 3, seed=12), randn(4, 3, seed=13)),
        ),
        Case(
            "4 queries and 4 keys of size 4",
            (randn(4, 4, seed=14), randn(4, 4, seed=15)),
        ),
        Case("vectors of size 1", (randn(2, 1, seed=16), randn(3, 1, seed=17))),
    ]


def check_cosine_similarity(fn) -> None:
    r"""Check ``fn(q, k)``: the ``(n, m)`` matrix of cosines between queries and keys.

    .. math:: C_{ij} = \frac{q_i \cdot k_j}{\lVert q_i\rVert\, \lVert k_j\rVert}

    ``q`` is ``(n, d)`` and ``k`` is ``(m, d)``, with no zero rows. Every entry lies in
    ``[-1, 1]`` and does not change when a query or a key is made longer. The inputs:
    ``n != m``, queries whose lengths run from 0.01 to 100, a square case, and ``d = 1``
    (every cosine is +1 or -1).

    Known mistakes are named: only the queries (or only the keys) divided by their
    lengths, lengths taken along the wrong axis, no division at all, and
    ``F.cosine_similarity(q, k)`` without the broadcasting views. Tolerance: 1e-10
    (float64).

    Example:
        >>> def my_cosine(q, k):
        ...     q = q / q.norm(dim=-1, keepdim=True)
        ...     return q @ (k / k.norm(dim=-1, keepdim=True)).T
        >>> check_cosine_similarity(my_cosine)  # doctest: +ELLIPSIS
        ✓ my_cosine: ... (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        cosine_scores,
        _cosine_cases(),
        what="the cosine of every query and key",
        properties=[
            Property(
                "every cosine must lie in [-1, 1]",
                lambda out, *_: out.abs() <= 1 + 1e-12,
            ),
        ],
        mistakes=[
            Mistake(
                "only the queries are divided by their lengths: divide each key by "
                "its length too",
                _queries_only,
            ),
            Mistake(
                "only the keys are divided by their lengths: divide each query by "
                "its length too",
                _keys_only,
            ),
            Mistake(
                "the lengths are taken along the wrong axis: a row's length is "
                "x.norm(dim=-1, keepdim=True)",
                _wrong_axis,
            ),
            Mistake(
                "these are dot products, not cosines: divide by the two lengths",
                dot_scores,
            ),
            Mistake(
                "F.cosine_similarity pairs rows up: give it q[:, None, :] and "
                "k[None, :, :], so that every query meets every key",
                _unbroadcast,
            ),
        ],
    )


# ----------------------------------------------------------------------------- angle


def _angle(a: Tensor, b: Tensor) -> Tensor:
    """The reference: arccos of the cosine, clamped to [-1, 1] against rounding."""
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    return torch.arccos(cos.clamp(-1.0, 1.0))


def _in_degrees(a, b):
    return torch.rad2deg(_angle(a, b))


def _unnormalised(a, b):
    return torch.arccos((a * b).sum(-1).clamp(-1.0, 1.0))


def _angle_cases() -> list[Case]:
    clamp = (
        "rounding can push the cosine of parallel vectors just past 1 (or -1), where "
        "arccos is NaN: clamp the cosine to [-1, 1] first"
    )
    a = randn(12, 5, seed=6)
    plane = torch.linalg.qr(randn(7, 2, seed=21))[0]  # two orthonormal columns
    return [
        Case("5 random pairs in 3-D", (randn(5, 3, seed=20), randn(5, 3, seed=22))),
        Case("one pair of 7-D vectors, no batch axis", (3 * plane[:, 0], plane[:, 1])),
        Case("12 parallel pairs (b = 2.5 a)", (a, 2.5 * a), hint=clamp),
        Case("12 opposite pairs (b = -0.3 a)", (a, -0.3 * a), hint=clamp),
    ]


def check_angle(fn) -> None:
    r"""Check ``fn(a, b)``: the angle between ``a`` and ``b``, in radians.

    .. math:: \theta = \arccos \frac{a \cdot b}{\lVert a\rVert\, \lVert b\rVert}
        \in [0, \pi]

    ``a`` and ``b`` are ``(..., d)``, non-zero; the result is ``(...)``: one angle per
    pair (a 0-dimensional tensor for two plain vectors). The inputs: random pairs,
    two orthogonal vectors without a batch axis (angle pi/2), and parallel and opposite
    pairs (angles 0 and pi), where rounding can make the cosine 1.0000000000000002 and
    ``arccos`` NaN unless it is clamped to ``[-1, 1]``.

    Known mistakes are named: degrees instead of radians, a dot product not divided by
    the lengths. Tolerance: 1e-6, because ``arccos`` magnifies rounding near 0 and pi
    (a cosine off by 1e-16 moves the angle by about 1e-8).

    Example:
        >>> def my_angle(a, b):
        ...     cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
        ...     return torch.arccos(cos.clamp(-1, 1))
        >>> check_angle(my_angle)  # doctest: +ELLIPSIS
        ✓ my_angle: ... (4 inputs, within 1e-06)
    """
    __tracebackhide__ = True
    check(
        fn,
        _angle,
        _angle_cases(),
        what="the angle between two vectors, in radians",
        atol=1e-6,
        properties=[
            Property(
                "an angle must lie in [0, pi]",
                lambda out, *_: (out >= -1e-6) & (out <= math.pi + 1e-6),
            ),
        ],
        mistakes=[
            Mistake(
                "the angle is in degrees: torch.arccos returns radians, keep them",
                _in_degrees,
            ),
            Mistake(
                "the dot product is not divided by the two lengths: arccos needs the "
                "cosine",
                _unnormalised,
            ),
        ],
    )
