"""Checkers for chapter 2's exercises: softmax, log-sum-exp, online step, Jacobian.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch02
    ch02.check_softmax(my_softmax)

Every input is float64; the tolerance is stated in the ``✓`` line.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..foundations.softmax import softmax
from ._checker import Case, Mistake, Property, check, randn

__all__ = [
    "check_softmax",
    "check_logsumexp",
    "check_online_softmax_step",
    "check_softmax_jacobian",
]

_INF = float("inf")

# --------------------------------------------------------------------------- softmax


def _dead(x: Tensor, dim: int) -> Tensor:
    """Slices along ``dim`` that are entirely ``-inf``: no softmax is defined there."""
    return x.isneginf().all(dim, keepdim=True)


def _sums_to_one(out, x, dim=-1):
    return ((out.sum(dim, keepdim=True) - 1).abs() <= 1e-9) | _dead(x, dim)


def _in_unit_interval(out, x, dim=-1):
    return ((out >= 0) & (out <= 1 + 1e-12)) | _dead(x, dim)


def _zero_where_minus_inf(out, x, dim=-1):
    return (out == 0) | ~x.isneginf() | _dead(x, dim)


def _zeros_for_dead_rows(x, dim=-1):
    return torch.nan_to_num(softmax(x, dim), nan=0.0)


def _no_shift(x, dim=-1):
    e = torch.exp(x)
    return e / e.sum(dim, keepdim=True)


def _global_max(x, dim=-1):
    e = torch.exp(x - x.max())
    return e / e.sum(dim, keepdim=True)


def _last_axis(x, dim=-1):
    return softmax(x, -1)


def _other_axis(x, dim=-1):
    return softmax(x, 0 if dim % x.dim() == x.dim() - 1 else -1)


def _sum_without_keepdim(x, dim=-1):
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim)


def _softmax_cases() -> list[Case]:
    overflow = "exp overflows to inf for scores near 1000: subtract the maximum first"
    large = torch.cat([1000.0 + randn(2, 5, seed=3), -1000.0 + randn(2, 5, seed=4)])
    masked = randn(3, 5, seed=5)
    masked[0, [1, 3]] = -_INF
    masked[2, [0, 1, 2, 4]] = -_INF
    dead = randn(3, 4, seed=6)
    dead[1] = -_INF
    return [
        Case("3 rows of 5 scores", (randn(3, 5, seed=0),)),
        Case(
            "one row of 4 equal scores", (torch.full((4,), 0.7, dtype=torch.float64),)
        ),
        Case("dim=0 of a (4, 3) tensor", (randn(4, 3, seed=1),), {"dim": 0}),
        Case("dim=1 of a (2, 4, 3) tensor", (randn(2, 4, 3, seed=2),), {"dim": 1}),
        Case("large scores (near +1000 and -1000)", (large,), hint=overflow),
        Case("-inf entries (masked scores)", (masked,)),
        Case(
            "a row that is entirely -inf",
            (dead,),
            also_accept=_zeros_for_dead_rows,
        ),
    ]


def check_softmax(fn) -> None:
    r"""Check ``fn(x, dim=-1)``: the softmax of ``x`` along ``dim``, from its formula.

    .. math:: \operatorname{softmax}(x)_k = \frac{e^{x_k - m}}{\sum_l e^{x_l - m}},
        \quad m = \max_l x_l

    ``fn`` takes a float tensor ``x`` of any shape and an int ``dim`` (default ``-1``)
    and returns a tensor of the shape and dtype of ``x`` whose slices along ``dim`` are
    non-negative and sum to 1. The inputs: a few rows; equal scores; ``dim=0`` and a
    middle ``dim``; scores near +1000 and -1000 (without the max shift ``exp``
    overflows to inf, or underflows to 0 and the division is 0/0); ``-inf`` entries,
    which must get weight exactly 0.

    A slice that is entirely ``-inf`` has no softmax: the course's
    :func:`attention.softmax` gives NaN there, as ``torch.softmax`` does, and so does
    the formula with the max shift (``-inf - (-inf)`` is NaN). Zeros are accepted too:
    that is what the attention functions give a query with no visible key (chapter 4).

    Known mistakes are named: no max shift, the maximum of the whole tensor instead of
    the slice's, ``dim`` ignored, the wrong axis, a sum that lost its axis (no
    ``keepdim=True``). Tolerance: 1e-10 (float64).

    Example:
        >>> def my_softmax(x, dim=-1):
        ...     e = torch.exp(x - x.amax(dim, keepdim=True))
        ...     return e / e.sum(dim, keepdim=True)
        >>> check_softmax(my_softmax)  # doctest: +ELLIPSIS
        ✓ my_softmax: softmax along dim, ... (7 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        softmax,
        _softmax_cases(),
        what="softmax along dim, large and -inf scores too",
        properties=[
            Property("the weights along dim must sum to 1", _sums_to_one),
            Property("every weight must lie in [0, 1]", _in_unit_interval),
            Property("a -inf score must get weight exactly 0", _zero_where_minus_inf),
        ],
        mistakes=[
            Mistake(
                "the max shift is missing: exp overflows for scores near 1000; "
                "subtract the maximum along dim before exp",
                _no_shift,
            ),
            Mistake(
                "the maximum is taken over the whole tensor: rows far below it "
                "underflow to 0/0; take it along dim with keepdim=True",
                _global_max,
            ),
            Mistake(
                "dim is ignored: normalise along the axis dim, not always the last one",
                _last_axis,
            ),
            Mistake(
                "it normalises along the wrong axis: reduce over dim, the axis "
                "whose weights must sum to 1",
                _other_axis,
            ),
            Mistake(
                "a reduction lost its axis: use keepdim=True in max and sum so they "
                "broadcast back along dim",
                _sum_without_keepdim,
            ),
        ],
    )


# ------------------------------------------------------------------------ online step


def _online_step(m: Tensor, l: Tensor, scores: Tensor):  # noqa: E741
    """The reference step: new running maximum and rescaled running sum."""
    m_new = torch.maximum(m, scores.amax(-1))  # (...)
    # a row that has seen only -inf keeps the shift 0 (no -inf - -inf)
    shift = m_new.masked_fill(m_new.isneginf(), 0.0)
    l_new = l * torch.exp(m - shift) + torch.exp(scores - shift[..., None]).sum(-1)
    return m_new, l_new


def _state(seen: Tensor) -> tuple[Tensor, Tensor]:
    """``(m, l)`` of the scores ``seen`` so far, straight from their definition."""
    m = seen.amax(-1)  # (...)
    return m, torch.exp(seen - m[..., None]).sum(-1)


def _step_case(name: str, seen: Tensor, block: Tensor) -> Case:
    m, l = _state(seen)  # noqa: E741
    return Case(name, (m, l, block))


def _no_rescale(m, l, scores):  # noqa: E741
    m_new = torch.maximum(m, scores.amax(-1))
    return m_new, l + torch.exp(scores - m_new[..., None]).sum(-1)


def _inverted_rescale(m, l, scores):  # noqa: E741
    m_new = torch.maximum(m, scores.amax(-1))
    return m_new, l * torch.exp(m_new - m) + torch.exp(scores - m_new[..., None]).sum(
        -1
    )


def _block_max_only(m, l, scores):  # noqa: E741
    m_new = scores.amax(-1)
    return m_new, l * torch.exp(m - m_new) + torch.exp(scores - m_new[..., None]).sum(
        -1
    )


def _unshifted_block(m, l, scores):  # noqa: E741
    m_new = torch.maximum(m, scores.amax(-1))
    return m_new, l * torch.exp(m - m_new) + torch.exp(scores).sum(-1)


def _online_cases() -> list[Case]:
    start = (
        torch.full((3,), -_INF, dtype=torch.float64),
        torch.zeros(3, dtype=torch.float64),
    )
    return [
        Case("the first block (m = -inf, l = 0)", (*start, randn(3, 4, seed=10))),
        _step_case(
            "a block whose maximum exceeds m",
            randn(3, 4, seed=11),
            randn(3, 4, seed=12) + 2,
        ),
        _step_case(
            "a block whose maximum is below m",
            randn(3, 4, seed=13) + 2,
            randn(3, 4, seed=14),
        ),
        _step_case("a block of one score", randn(3, 6, seed=15), randn(3, 1, seed=16)),
        _step_case(
            "batch dims (2, 3)", randn(2, 3, 5, seed=17), randn(2, 3, 4, seed=18)
        ),
        _step_case(
            "large scores (near 1000)",
            1000.0 + randn(3, 4, seed=19),
            1001.0 + randn(3, 4, seed=20),
        ),
    ]


def check_online_softmax_step(fn) -> None:
    r"""Check ``fn(m, l, scores) -> (m_new, l_new)``: one step of the online softmax.

    The online softmax reads a row of scores a block at a time and keeps two numbers
    per row: the running maximum ``m`` of the scores seen so far and the running sum
    ``l`` of their ``exp(score - m)``. One step takes a new block and returns

    .. math:: m' = \max\bigl(m, \max_k s_k\bigr), \qquad
        l' = l\, e^{m - m'} + \sum_k e^{s_k - m'} .

    Args of ``fn``:
        m: ``(...)`` running maximum (``-inf`` before the first block).
        l: ``(...)`` running sum of ``exp(score - m)`` (0 before the first block).
        scores: ``(..., n)`` the new block of (finite) scores, a row per entry of ``m``.

    ``fn`` returns the tuple ``(m_new, l_new)``, both ``(...)`` like ``m``, same dtype.
    After the last block, ``softmax(x)_k = exp(x_k - m) / l``. The inputs: the first
    block; a block that raises the maximum (the old sum must be rescaled) and one that
    does not; a block of one score; batch dims; scores near 1000 (without the shift
    ``exp`` overflows). Known mistakes are named: the old sum not rescaled, the
    rescaling factor upside down, a maximum that forgets ``m``, an unshifted block.
    Tolerance: 1e-10 (float64).

    Example:
        >>> def my_step(m, l, scores):
        ...     m_new = torch.maximum(m, scores.amax(-1))
        ...     l_new = l * torch.exp(m - m_new)
        ...     return m_new, l_new + torch.exp(scores - m_new[..., None]).sum(-1)
        >>> check_online_softmax_step(my_step)  # doctest: +ELLIPSIS
        ✓ my_step: one online-softmax step: ... (6 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _online_step,
        _online_cases(),
        what="one online-softmax step: new max, rescaled sum",
        outputs=("m_new", "l_new"),
        properties=[
            Property(
                "m_new must be at least m and every new score",
                lambda out, m, _, s: (out[0] >= m) & (out[0] >= s.amax(-1)),
            ),
            Property(
                "l_new must be at least 1: the largest score adds exp(0) = 1",
                lambda out, *_: out[1] >= 1 - 1e-12,
            ),
        ],
        mistakes=[
            Mistake(
                "the old sum is not rescaled: when the maximum grows from m to m_new, "
                "multiply l by exp(m - m_new)",
                _no_rescale,
            ),
            Mistake(
                "the rescaling factor is upside down: it is exp(m - m_new), at most 1",
                _inverted_rescale,
            ),
            Mistake(
                "the new maximum forgets the running one: "
                "m_new = max(m, max of the block)",
                _block_max_only,
            ),
            Mistake(
                "the block's exponentials are not shifted: sum exp(scores - m_new), "
                "not exp(scores)",
                _unshifted_block,
            ),
        ],
    )


# ------------------------------------------------------------------------ log-sum-exp


def _lse_unshifted(x, dim=-1):
    return torch.log(torch.exp(x).sum(dim))


def _lse_without_adding_back(x, dim=-1):
    m = x.amax(dim, keepdim=True)
    return torch.log(torch.exp(x - m).sum(dim))


def _lse_keepdim(x, dim=-1):
    return torch.logsumexp(x, dim, keepdim=True)


def _lse_max_only(x, dim=-1):
    return x.amax(dim)


def _lse_cases() -> list[Case]:
    overflow = "exp overflows for scores near 1000: subtract the maximum, add it back"
    masked = randn(3, 5, seed=31)
    masked[0, [1, 3]] = -_INF
    return [
        Case("3 rows of 5 scores", (randn(3, 5, seed=30),)),
        Case(
            "one row of 4 equal scores", (torch.full((4,), -2.5, dtype=torch.float64),)
        ),
        Case("dim=0 of a (4, 3) tensor", (randn(4, 3, seed=32),), {"dim": 0}),
        Case(
            "large scores (near +1000 and -1000)",
            (torch.cat([1000 + randn(2, 4, seed=33), -1000 + randn(2, 4, seed=34)]),),
            hint=overflow,
        ),
        Case("-inf entries (masked scores)", (masked,)),
    ]


def check_logsumexp(fn) -> None:
    r"""Check ``fn(x, dim=-1)``: the log-sum-exp of ``x`` along ``dim``, safely.

    .. math:: \operatorname{LSE}(x) = \log \sum_k e^{x_k}
        = m + \log \sum_k e^{x_k - m}, \quad m = \max_k x_k

    ``fn`` returns ``x`` with the axis ``dim`` removed (as ``torch.logsumexp(x, dim)``).
    The inputs: a few rows; equal scores (the answer is the score plus ``log n``);
    ``dim=0``; scores near +1000 and -1000, where ``exp`` overflows or underflows
    unless the maximum is taken out first; ``-inf`` entries (masked scores, which add
    nothing). Known mistakes are named: no shift, a shift that is not added back, the
    axis kept, the maximum alone. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_lse(x, dim=-1):
        ...     m = x.amax(dim, keepdim=True)
        ...     total = torch.exp(x - m).sum(dim, keepdim=True)
        ...     return (m + torch.log(total)).squeeze(dim)
        >>> check_logsumexp(my_lse)  # doctest: +ELLIPSIS
        ✓ my_lse: log-sum-exp along dim, ... (5 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        lambda x, dim=-1: torch.logsumexp(x, dim),
        _lse_cases(),
        what="log-sum-exp along dim, large scores too",
        properties=[
            Property(
                "LSE must lie between the maximum and the maximum + log n",
                lambda out, x, dim=-1: (
                    (out >= x.amax(dim) - 1e-12)
                    & (out <= x.amax(dim) + math.log(x.shape[dim]) + 1e-12)
                ),
            ),
        ],
        mistakes=[
            Mistake(
                "the maximum is not taken out: exp overflows near 1000; compute "
                "m + log(sum(exp(x - m)))",
                _lse_unshifted,
            ),
            Mistake(
                "the maximum is subtracted but not added back: LSE = m + log(sum(exp(x "
                "- m)))",
                _lse_without_adding_back,
            ),
            Mistake(
                "the axis dim is kept: return one number per slice, without keepdim "
                "(squeeze it)",
                _lse_keepdim,
            ),
            Mistake(
                "this is the maximum alone: add log(sum(exp(x - m)))",
                _lse_max_only,
            ),
        ],
    )


# ----------------------------------------------------------------------- the Jacobian


def _jacobian(z: Tensor) -> Tensor:
    """The reference: diag(s) - s s^T, batched over the leading axes."""
    s = torch.softmax(z, -1)
    return torch.diag_embed(s) - s[..., :, None] * s[..., None, :]


def _diag_only(z):
    return torch.diag_embed(torch.softmax(z, -1))


def _outer_only(z):
    s = torch.softmax(z, -1)
    return -s[..., :, None] * s[..., None, :]


def _sign_flipped(z):
    return -_jacobian(z)


def _diagonal_formula_everywhere(z):
    s = torch.softmax(z, -1)
    return (s * (1 - s))[..., None, :].expand(*s.shape, s.shape[-1]).clone()


def _of_the_scores(z):
    return torch.diag_embed(z) - z[..., :, None] * z[..., None, :]


def _one_row_only(z):
    s = torch.softmax(z, -1)
    return torch.diag(s) - torch.outer(s, s)


def _jacobian_cases() -> list[Case]:
    return [
        Case("5 scores", (randn(5, seed=40),)),
        Case("2 scores", (randn(2, seed=41),)),
        Case("a batch of 3 rows of 4 scores", (randn(3, 4, seed=42),)),
        Case("one score far above the others (saturated)", (randn(6, seed=43) * 20,)),
    ]


def check_softmax_jacobian(fn) -> None:
    r"""Check ``fn(z)``: the Jacobian of the softmax, diag(s) - s sᵀ.

    Entry ``(i, k)`` is :math:`\partial s_i / \partial z_k`: :math:`s_i (1 - s_i)` on
    the diagonal and :math:`-s_i s_k` off it, where
    :math:`s = \operatorname{softmax}(z)`.
    ``z`` is ``(..., n)``; the result is ``(..., n, n)``, one Jacobian per row (for a
    batch, ``torch.diag_embed`` builds the diagonal matrices). The inputs: 5 and 2
    scores, a batch of rows, and a saturated row where one weight is near 1 and the
    Jacobian near 0. Known mistakes are named: the diagonal part alone, the outer
    product alone, the sign flipped, the diagonal formula used everywhere, the scores
    used in place of the weights. Tolerance: 1e-10 (float64).

    Example:
        >>> def my_jacobian(z):
        ...     s = torch.softmax(z, -1)
        ...     return torch.diag_embed(s) - s[..., :, None] * s[..., None, :]
        >>> check_softmax_jacobian(my_jacobian)  # doctest: +ELLIPSIS
        ✓ my_jacobian: ... (4 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _jacobian,
        _jacobian_cases(),
        what="the softmax Jacobian diag(s) - s sᵀ",
        properties=[
            Property(
                "every row of the Jacobian must sum to 0 (adding a constant to every "
                "score changes nothing)",
                lambda out, z: out.sum(-1).abs() <= 1e-10,
            ),
        ],
        mistakes=[
            Mistake(
                "only diag(s): subtract the outer product s sᵀ too",
                _diag_only,
            ),
            Mistake(
                "only -s sᵀ: add diag(s), the diagonal part",
                _outer_only,
            ),
            Mistake(
                "the sign is flipped: it is diag(s) - s sᵀ, positive on the diagonal",
                _sign_flipped,
            ),
            Mistake(
                "s_k (1 - s_k) belongs on the diagonal only; off it, entry (i, k) is "
                "-s_i s_k",
                _diagonal_formula_everywhere,
            ),
            Mistake(
                "the scores z are used in place of the weights s = softmax(z)",
                _of_the_scores,
            ),
            Mistake(
                "torch.diag and torch.outer take one row: for a batch use "
                "torch.diag_embed(s) and s[..., :, None] * s[..., None, :]",
                _one_row_only,
            ),
        ],
    )
