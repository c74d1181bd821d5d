"""Checkers for chapter 3's exercises: scaled scores, a row's entropy, da/dq.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch03
    ch03.check_scaled_scores(my_scaled_scores)

Every input is float64; the tolerance is stated in the ``✓`` line. Shape legend: ``i``
queries, ``j`` keys, ``d`` the size of a query or key.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..foundations.softmax import entropy, softmax_jacobian
from ..layers.scoring import dot_scores, scaled_dot_scores
from ._checker import Case, Mistake, Property, check, randn

__all__ = ["check_scaled_scores", "check_row_entropy", "check_query_jacobian"]

# --------------------------------------------------------------------- scaled scores


def _divided_by_d(q, k):
    return q @ k.transpose(-2, -1) / q.shape[-1]


def _sqrt_of_queries(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-2])


def _sqrt_of_keys(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(k.shape[-2])


def _multiplied(q, k):
    return q @ k.transpose(-2, -1) * math.sqrt(q.shape[-1])


def _key_not_transposed(q, k):
    return q @ k / math.sqrt(q.shape[-1])


def _transposed_2d(q, k):
    return q @ k.T / math.sqrt(q.shape[-1])


def _scaled_cases() -> list[Case]:
    return [
        Case(
            "3 queries, 5 keys of size 16",
            (randn(3, 16, seed=50), randn(5, 16, seed=51)),
        ),
        Case(
            "a batch: (2, 3, 16) queries, (2, 5, 16) keys",
            (randn(2, 3, 16, seed=52), randn(2, 5, 16, seed=53)),
        ),
        Case(
            "4 queries, 4 keys of size 4", (randn(4, 4, seed=54), randn(4, 4, seed=55))
        ),
        Case(
            "2 queries, 7 keys of size 64",
            (randn(2, 64, seed=56), randn(7, 64, seed=57)),
        ),
    ]


def check_scaled_scores(fn) -> None:
    r"""Check ``fn(q, k)``: the scaled scores :math:`q K^\top / \sqrt{d}`.

    ``q`` is ``(..., i, d)`` and ``k`` is ``(..., j, d)``, with the same leading (batch)
    axes; the result is ``(..., i, j)``. ``d`` is the size of a query, the last axis.
    The inputs: a plain pair with ``i != j``, a batch (``k.T`` no longer transposes the
    right axes: use ``k.transpose(-2, -1)``), a square case where ``i = j = d``, and
    ``d = 64``.

    Known mistakes are named: the scale missing, a division by ``d`` instead of
    ``sqrt(d)``, the square root of the number of queries or keys, a multiplication
    instead of a division, the key not transposed, ``k.T`` on a batch. Tolerance: 1e-10
    (float64).

    Example:
        >>> def my_scaled_scores(q, k):
        ...     return q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        >>> check_scaled_scores(my_scaled_scores)  # doctest: +ELLIPSIS
        ✓ my_scaled_scores: ... (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        scaled_dot_scores,
        _scaled_cases(),
        what="scaled scores q Kᵀ / sqrt(d), batched",
        mistakes=[
            Mistake(
                "the 1/sqrt(d) is missing: these are the raw dot products",
                dot_scores,
            ),
            Mistake(
                "the scores are divided by d: divide by sqrt(d), the square root of "
                "the query size",
                _divided_by_d,
            ),
            Mistake(
                "the square root is of the number of queries: d is the size of a "
                "query, q.shape[-1]",
                _sqrt_of_queries,
            ),
            Mistake(
                "the square root is of the number of keys: d is the size of a "
                "query, q.shape[-1]",
                _sqrt_of_keys,
            ),
            Mistake(
                "the scores are multiplied by sqrt(d): divide by it",
                _multiplied,
            ),
            Mistake(
                "the key is not transposed: q (i, d) times k transposed (d, j)",
                _key_not_transposed,
            ),
            Mistake(
                "k.T reverses every axis of a batch: use k.transpose(-2, -1)",
                _transposed_2d,
            ),
        ],
    )


# ----------------------------------------------------------------------- row entropy


def _in_bits(p):
    return entropy(p) / math.log(2)


def _without_minus(p):
    return -entropy(p)


def _mean_not_sum(p):
    return entropy(p) / p.shape[-1]


def _entropy_cases() -> list[Case]:
    masked = torch.softmax(randn(3, 6, seed=61), -1)
    masked[0, [1, 4]] = 0.0
    masked[0] = masked[0] / masked[0].sum()
    zeros = "a weight of exactly 0 adds 0 (the limit of p log p): 0 * log 0 is NaN in "
    zeros += "floating point, so use torch.xlogy(p, p) or torch.special.entr(p)"
    return [
        Case("4 rows of 6 weights", (torch.softmax(randn(4, 6, seed=60), -1),)),
        Case(
            "uniform weights over 8 keys (entropy log 8)",
            (torch.full((8,), 1 / 8, dtype=torch.float64),),
        ),
        Case(
            "a batch (2, 3, 5) of rows",
            (torch.softmax(randn(2, 3, 5, seed=62), -1),),
        ),
        Case(
            "a row with two weights of exactly 0 (masked keys)", (masked,), hint=zeros
        ),
        Case(
            "a one-hot row (entropy 0)",
            (torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64),),
            hint=zeros,
        ),
    ]


def check_row_entropy(fn) -> None:
    r"""Check ``fn(p)``: the entropy, in nats, of each row of weights ``p``.

    .. math:: H(p) = -\sum_j p_j \log p_j

    ``p`` is ``(..., n)``: rows of non-negative weights that sum to 1 along the last
    axis. The result is ``(...)``, one entropy per row, with the natural logarithm. A
    weight of exactly 0 adds 0 (the limit of ``p log p``), although ``0 * log 0`` is NaN
    in floating point. The inputs: random rows, uniform weights (``log n``), a batch, a
    row with zeros (masked keys) and a one-hot row (0).

    Known mistakes are named: bits instead of nats (``log2``), the minus sign missing,
    a mean instead of a sum. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_entropy(p):
        ...     return -torch.xlogy(p, p).sum(-1)
        >>> check_row_entropy(my_entropy)  # doctest: +ELLIPSIS
        ✓ my_entropy: ... (5 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        entropy,
        _entropy_cases(),
        what="the entropy of each row, in nats",
        properties=[
            Property(
                "an entropy lies in [0, log n]",
                lambda out, p: (out >= -1e-12) & (out <= math.log(p.shape[-1]) + 1e-12),
            ),
        ],
        mistakes=[
            Mistake(
                "this is in bits (log base 2): use the natural log, torch.log",
                _in_bits,
            ),
            Mistake(
                "the minus sign is missing: log p <= 0, so H = -sum p log p >= 0",
                _without_minus,
            ),
            Mistake(
                "this is a mean over the keys: the entropy is the sum",
                _mean_not_sum,
            ),
        ],
    )


# ------------------------------------------------------------------------ d a / d q


def _query_jacobian(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """The reference: da/dq = J(z) s K, with z = s K q and J = diag(a) - a aᵀ."""
    z = scale * (k @ q)  # (n,)
    return softmax_jacobian(z) @ (scale * k)  # (n, n) @ (n, d) -> (n, d)


def _no_chain_scale(q, k, scale):
    return softmax_jacobian(scale * (k @ q)) @ k


def _unscaled_logits(q, k, scale):
    return softmax_jacobian(k @ q) @ (scale * k)


def _diag_only(q, k, scale):
    a = torch.softmax(scale * (k @ q), -1)
    return torch.diag(a) @ (scale * k)


def _flipped(q, k, scale):
    return -_query_jacobian(q, k, scale)


def _jacobian_cases() -> list[Case]:
    return [
        Case(
            "a query of size 4, 6 keys, scale 1/2",
            (randn(4, seed=70), randn(6, 4, seed=71), 0.5),
        ),
        Case(
            "a query of size 16, 3 keys, scale 1/4",
            (randn(16, seed=72), randn(3, 16, seed=73), 0.25),
        ),
        Case(
            "a query of size 8, 5 keys, no scale (1.0)",
            (randn(8, seed=74), randn(5, 8, seed=75), 1.0),
        ),
        Case(
            "a saturated row: size 64, 4 keys, scale 1",
            (randn(64, seed=76), randn(4, 64, seed=77), 1.0),
        ),
    ]


def check_query_jacobian(fn) -> None:
    r"""Check ``fn(q, k, scale)``: the Jacobian of one row of weights w.r.t. its query.

    With logits :math:`z = s\, K q` and weights :math:`a = \operatorname{softmax}(z)`,
    the chain rule gives

    .. math:: \frac{\partial a}{\partial q} = \bigl(\operatorname{diag}(a) - a a^\top
        \bigr)\, s K ,

    an ``(n, d)`` matrix: entry ``(j, l)`` is how weight ``j`` moves when coordinate
    ``l`` of the query moves. ``q`` is ``(d,)``, ``k`` is ``(n, d)``, ``scale`` is the
    number ``s``. The inputs: two scaled rows, an unscaled one, and a saturated row
    (one weight near 1), whose Jacobian is near 0. Its rows sum to 0: the weights
    always add up to 1, so their changes cancel.

    Known mistakes are named: the scale forgotten in the chain rule (``J K`` instead of
    ``J s K``), the softmax taken of unscaled logits, ``diag(a)`` without ``- a aᵀ``,
    the sign flipped. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_jacobian(q, k, scale):
        ...     a = torch.softmax(scale * (k @ q), dim=-1)
        ...     return (torch.diag(a) - torch.outer(a, a)) @ (scale * k)
        >>> check_query_jacobian(my_jacobian)  # doctest: +ELLIPSIS
        ✓ my_jacobian: ... (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _query_jacobian,
        _jacobian_cases(),
        what="da/dq = (diag(a) - a aᵀ) s K",
        properties=[
            Property(
                "each column of da/dq must sum to 0 over the keys: the weights "
                "always add up to 1",
                lambda out, q, k, scale: out.sum(-2).abs() <= 1e-10,
            ),
        ],
        mistakes=[
            Mistake(
                "the scale is missing from the chain rule: z = s K q, so dz/dq = s K",
                _no_chain_scale,
            ),
            Mistake(
                "the weights come from unscaled logits: a = softmax(s K q)",
                _unscaled_logits,
            ),
            Mistake(
                "only diag(a): the softmax Jacobian is diag(a) - a aᵀ",
                _diag_only,
            ),
            Mistake(
                "the sign is flipped: the Jacobian is diag(a) - a aᵀ, then s K",
                _flipped,
            ),
        ],
    )
