"""Checkers for chapter 2's exercises: softmax from its formula, an online-softmax step.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch02
    ch02.check_softmax(my_softmax)

Every input is float64; the tolerance is stated in the ``✓`` line.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..foundations.softmax import softmax
from ._checker import Case, Mistake, Property, check, randn

__all__ = ["check_softmax", "check_online_softmax_step"]

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
