"""Checkers for chapter 14's exercises: one tile of the online softmax with its output
accumulator, tiled attention's loop, and the log-sum-exp of a row.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch14
    ch14.check_online_attention_step(my_step)

Shape legend: ``i`` queries, ``n`` scores of a block (keys), ``e`` value size, ``j``
keys, ``d`` query/key size. The inputs are float64; the expected answers are computed
here from their definitions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from ._checker import Case, ExerciseError, Mistake, Property, check, randn

__all__ = ["check_online_attention_step", "check_tiled_attention", "check_logsumexp"]

_INF = math.inf

# ------------------------------------------------------------------------ one tile


def _attention_step(m, l, acc, scores, v):  # noqa: E741
    """The reference: fold a block of scores and its values into the running state."""
    m_new = torch.maximum(m, scores.amax(-1))  # (..., i)
    shift = m_new.masked_fill(m_new.isneginf(), 0.0)  # nothing seen yet: shift 0
    alpha = torch.exp(m - shift)  # (..., i): rescales what came before
    p = torch.exp(scores - shift[..., None])  # (..., i, n)
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v


def _seen(scores: Tensor, v: Tensor):
    """``(m, l, acc)`` after the scores ``scores`` and values ``v``, by definition."""
    m = scores.amax(-1)
    p = torch.exp(scores - m[..., None])
    return m, p.sum(-1), p @ v


def _step_case(name: str, before, after, *, e: int = 3, seed: int = 0) -> Case:
    """The state after the scores ``before`` (with random values), then a block."""
    v_seen = randn(*before.shape[:-2], before.shape[-1], e, seed=seed)
    v_block = randn(*after.shape[:-2], after.shape[-1], e, seed=seed + 1)
    return Case(name, (*_seen(before, v_seen), after, v_block))


def _step_cases() -> list[Case]:
    start = (
        torch.full((4,), -_INF, dtype=torch.float64),
        torch.zeros(4, dtype=torch.float64),
        torch.zeros(4, 3, dtype=torch.float64),
    )
    masked = randn(4, 5, seed=30)
    masked[1, 3:] = -_INF  # keys hidden from query 1
    return [
        Case(
            "the first block (m = -inf, l = 0, acc = 0)",
            (*start, randn(4, 5, seed=20), randn(5, 3, seed=21)),
        ),
        _step_case(
            "a block whose maximum exceeds m",
            randn(4, 6, seed=22),
            randn(4, 5, seed=23) + 2,
            seed=24,
        ),
        _step_case(
            "a block whose maximum is below m",
            randn(4, 6, seed=25) + 2,
            randn(4, 5, seed=26),
            seed=27,
        ),
        _step_case(
            "a block with masked (-inf) scores", randn(4, 6, seed=28), masked, seed=31
        ),
        _step_case(
            "batch dims (2, 4)",
            randn(2, 4, 6, seed=32),
            randn(2, 4, 5, seed=33),
            seed=34,
        ),
        _step_case(
            "large scores (near 1000)",
            1000.0 + randn(4, 6, seed=35),
            1001.0 + randn(4, 5, seed=36),
            seed=37,
        ),
    ]


def _acc_not_rescaled(m, l, acc, scores, v):  # noqa: E741
    m_new, l_new, _ = _attention_step(m, l, acc, scores, v)
    p = torch.exp(scores - m_new[..., None])
    return m_new, l_new, acc + p @ v


def _acc_normalised(m, l, acc, scores, v):  # noqa: E741
    m_new, l_new, acc_new = _attention_step(m, l, acc, scores, v)
    return m_new, l_new, acc_new / l_new[..., None]


def _rescale_inverted(m, l, acc, scores, v):  # noqa: E741
    m_new = torch.maximum(m, scores.amax(-1))
    alpha = torch.exp(m_new - m).nan_to_num(0.0, 0.0, 0.0)
    p = torch.exp(scores - m_new[..., None])
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v


def _unshifted(m, l, acc, scores, v):  # noqa: E741
    m_new = torch.maximum(m, scores.amax(-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores)
    return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v


def check_online_attention_step(fn) -> None:
    r"""Check ``fn(m, l, acc, scores, v) -> (m_new, l_new, acc_new)``: one tile.

    Tiled attention keeps three things per query row: the running maximum ``m`` of
    the scores seen so far, the running sum ``l`` of their :math:`e^{s - m}`, and the
    unnormalised output ``acc``, the sum of :math:`e^{s - m} v` over the keys seen. One
    step folds in a new block of scores and its values:

    .. math::

        m' = \max(m, \max_k s_k), \quad
        l' = l\, e^{m - m'} + \sum_k e^{s_k - m'}, \quad
        \text{acc}' = \text{acc}\, e^{m - m'} + \sum_k e^{s_k - m'} v_k .

    Args of ``fn``: ``m`` and ``l`` ``(..., i)``, ``acc`` ``(..., i, e)``, ``scores``
    ``(..., i, n)`` (``-inf`` for a masked key), ``v`` ``(..., n, e)``. Before the
    first block ``m = -inf``, ``l = 0``, ``acc = 0``. It returns the tuple
    ``(m_new, l_new, acc_new)``. After the last block the output is ``acc / l``: the
    division waits until then. The inputs: the first block; a block that raises the
    maximum and one that does not; masked scores; batch dims; scores near 1000.
    Known mistakes are named: the accumulator not rescaled, the accumulator divided
    by the sum too early, the factor upside down, unshifted exponentials.

    Example:
        >>> def my_step(m, l, acc, scores, v):
        ...     m_new = torch.maximum(m, scores.amax(-1))
        ...     alpha = torch.exp(m - m_new)
        ...     p = torch.exp(scores - m_new[..., None])
        ...     return m_new, l * alpha + p.sum(-1), acc * alpha[..., None] + p @ v
        >>> check_online_attention_step(my_step)  # doctest: +ELLIPSIS
        ✓ my_step: one tile of tiled attention: m, l and acc (6 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _attention_step,
        _step_cases(),
        what="one tile of tiled attention: m, l and acc",
        outputs=("m_new", "l_new", "acc_new"),
        properties=[
            Property(
                "m_new must be at least m: the running maximum never falls",
                lambda out, m, *_: out[0] >= m,
            ),
        ],
        mistakes=[
            Mistake(
                "the accumulator is not rescaled: when the maximum grows from m to "
                "m_new, multiply acc by exp(m - m_new), as l",
                _acc_not_rescaled,
            ),
            Mistake(
                "acc is divided by the sum too early: keep it unnormalised and divide "
                "once, after the last block",
                _acc_normalised,
            ),
            Mistake(
                "the rescaling factor is upside down: it is exp(m - m_new), at most 1",
                _rescale_inverted,
            ),
            Mistake(
                "the block's exponentials are not shifted: use exp(scores - m_new)",
                _unshifted,
            ),
        ],
    )


# ------------------------------------------------------------------------ the loop


def _attention(q, k, v, block_size):
    """The reference: softmax(q kᵀ / sqrt(d)) v, computed whole."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def _unscaled(q, k, v, block_size):
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def _last_block_dropped(q, k, v, block_size):
    j = k.shape[-2] // block_size * block_size
    return _attention(q, k[..., :j, :], v[..., :j, :], block_size)


def _blocks_normalised_apart(q, k, v, block_size):
    """Each block's own softmax, the block outputs summed."""
    out = 0
    for j0 in range(0, k.shape[-2], block_size):
        blk = slice(j0, j0 + block_size)
        out = out + _attention(q, k[..., blk, :], v[..., blk, :], block_size)
    return out


def _blocks_averaged(q, k, v, block_size):
    out = _blocks_normalised_apart(q, k, v, block_size)
    return out / math.ceil(k.shape[-2] / block_size)


def _loop_cases() -> list[Case]:
    def qkv(i, j, d, e, seed, batch=(), scale=1.0):
        return (
            randn(*batch, i, d, seed=seed, scale=scale),
            randn(*batch, j, d, seed=seed + 1),
            randn(*batch, j, e, seed=seed + 2),
        )

    return [
        Case("i = 5, j = 12, blocks of 4", (*qkv(5, 12, 4, 3, 40), 4)),
        Case("j = 10, blocks of 4: a last block of 2", (*qkv(5, 10, 4, 3, 43), 4)),
        Case("blocks of 1 key", (*qkv(3, 6, 4, 2, 46), 1)),
        Case("a block larger than j = 7", (*qkv(4, 7, 4, 3, 49), 16)),
        Case("batch dims (2,)", (*qkv(5, 9, 4, 3, 52, batch=(2,)), 4)),
        Case(
            "large scores (queries times 60)",
            (*qkv(5, 12, 4, 3, 55, scale=60.0), 4),
            hint="exp overflowed: shift each block's exponentials by the running max",
        ),
    ]


class _Shapes(TorchFunctionMode):
    """Records the shape of every tensor that torch functions return."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, Tensor):
                self.shapes.append(tuple(t.shape))
        return out


def _refuse_the_whole_matrix(fn) -> None:
    """Raise when ``fn`` builds the whole ``(i, j)`` matrix of scores or weights.

    Runs ``fn`` once on ``i = 6`` queries and ``j = 20`` keys in blocks of 4, watching
    the shape of every tensor torch returns. A call that raises is left to ``check``,
    which reports it.
    """
    __tracebackhide__ = True
    q, k, v = randn(6, 4, seed=60), randn(20, 4, seed=61), randn(20, 3, seed=62)
    watch = _Shapes()
    try:
        with watch:
            fn(q, k, v, 4)
    except Exception:  # the reader's code may raise anything: check reports it
        return
    if any(s[-2:] in ((6, 20), (20, 6)) for s in watch.shapes if len(s) >= 2):
        name = getattr(fn, "__name__", "your function")
        raise ExerciseError(
            f"{name} built the whole (6, 20) matrix of scores for 6 queries and 20 "
            "keys: compute one (i, block_size) tile at a time and carry m, l and acc "
            "from block to block"
        )


def check_tiled_attention(fn) -> None:
    r"""Check ``fn(q, k, v, block_size)``: exact attention, one block of keys at a time.

    ``q`` ``(..., i, d)``, ``k`` ``(..., j, d)``, ``v`` ``(..., j, e)``. Loop over the
    keys in blocks of ``block_size`` (the last block may be shorter), score each block
    against all queries (scaled by :math:`1/\sqrt{d}`), fold it into the running ``m``,
    ``l`` and ``acc`` of every query, and return ``acc / l``, ``(..., i, e)``: equal to
    :math:`\operatorname{softmax}(q k^\top / \sqrt d)\, v`. The whole ``(i, j)`` matrix
    must never exist: the checker watches the shapes your function builds. The inputs:
    blocks that divide ``j`` and a shorter last block; blocks of one key and blocks
    longer than ``j``; batch dims; large scores. Known mistakes are named: the missing
    :math:`1/\sqrt d`, the last block dropped, each block normalised on its own.

    Example:
        >>> def my_tiled_attention(q, k, v, block_size):
        ...     scale = q.shape[-1] ** -0.5
        ...     m = torch.full(q.shape[:-1], -torch.inf, dtype=q.dtype)
        ...     l = torch.zeros(q.shape[:-1], dtype=q.dtype)
        ...     acc = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        ...     for j0 in range(0, k.shape[-2], block_size):
        ...         kb = k[..., j0 : j0 + block_size, :]
        ...         s = q @ kb.transpose(-2, -1) * scale
        ...         m_new = torch.maximum(m, s.amax(-1))
        ...         alpha, p = torch.exp(m - m_new), torch.exp(s - m_new[..., None])
        ...         l = l * alpha + p.sum(-1)
        ...         acc = acc * alpha[..., None] + p @ v[..., j0 : j0 + block_size, :]
        ...         m = m_new
        ...     return acc / l[..., None]
        >>> check_tiled_attention(my_tiled_attention)  # doctest: +ELLIPSIS
        ✓ my_tiled_attention: attention one key block at a time (6 inputs, ...)
    """
    __tracebackhide__ = True
    _refuse_the_whole_matrix(fn)
    check(
        fn,
        _attention,
        _loop_cases(),
        what="attention one key block at a time",
        mistakes=[
            Mistake(
                "the scores are not scaled: multiply q kᵀ by 1/sqrt(d)",
                _unscaled,
            ),
            Mistake(
                "the last, shorter block is dropped: loop with range(0, j, block_size) "
                "and slice past the end (a slice stops at j by itself)",
                _last_block_dropped,
            ),
            Mistake(
                "each block is normalised on its own: carry m, l and acc across the "
                "blocks, rescale them, and divide once at the end",
                _blocks_normalised_apart,
            ),
            Mistake(
                "the block outputs are averaged: they weigh as their share of the "
                "row's sum; carry m, l and acc and divide once at the end",
                _blocks_averaged,
            ),
        ],
    )


# ------------------------------------------------------------------------ log-sum-exp


def _logsumexp(x):
    return torch.logsumexp(x, dim=-1)


def _lse_unshifted(x):
    return torch.log(torch.exp(x).sum(-1))


def _lse_global_max(x):
    m = x.max()
    return m + torch.log(torch.exp(x - m).sum(-1))


def _lse_shift_not_added_back(x):
    m = x.amax(-1, keepdim=True)
    return torch.log(torch.exp(x - m).sum(-1))


def _lse_naive_shift(x):
    """The max shift without the ``-inf`` row rule: NaN for a row of ``-inf``."""
    m = x.amax(-1, keepdim=True)
    return m.squeeze(-1) + torch.log(torch.exp(x - m).sum(-1))


def _lse_of_mean(x):
    m = x.amax(-1, keepdim=True)
    return m.squeeze(-1) + torch.log(torch.exp(x - m).mean(-1))


def _lse_cases() -> list[Case]:
    masked = randn(3, 6, seed=70)
    masked[0, 2:] = -_INF
    masked[2, :4] = -_INF
    dead = randn(3, 5, seed=71)
    dead[1] = -_INF
    mixed = torch.stack([randn(6, seed=72), 800.0 + randn(6, seed=73)])
    return [
        Case("3 rows of 5 scores", (randn(3, 5, seed=74),)),
        Case(
            "scores near 1000",
            (1000.0 + randn(3, 5, seed=75),),
            hint="exp(1000) overflows: subtract the row's maximum first",
        ),
        Case(
            "scores near -1000",
            (-1000.0 + randn(3, 5, seed=76),),
            hint="exp(-1000) underflows to 0 and log(0) = -inf: subtract the row's "
            "maximum first",
        ),
        Case(
            "one row near 0, one near 800",
            (mixed,),
            hint="shift each row by its own maximum, not by one for the whole tensor",
        ),
        Case("masked (-inf) scores", (masked,)),
        Case("a row entirely -inf (a query that sees no key)", (dead,)),
        Case("batch dims (2, 3)", (randn(2, 3, 4, seed=77),)),
    ]


def _at_least_the_maximum(out, x):
    top = x.amax(-1)
    return ~top.isfinite() | (out >= top - 1e-12)


def check_logsumexp(fn) -> None:
    r"""Check ``fn(x)``: the log-sum-exp of each row, :math:`\log \sum_k e^{x_k}`.

    ``x`` ``(..., n)``; ``fn`` returns ``(...)``, computed stably: with the row's
    maximum :math:`m`, :math:`\log\sum_k e^{x_k} = m + \log \sum_k e^{x_k - m}`. It is
    what tiled attention saves per query (``m + log l``). The inputs: ordinary rows;
    scores near 1000 (overflow) and near -1000 (underflow); rows of very different
    sizes; masked ``-inf`` entries; a row that is entirely ``-inf``, whose answer is
    ``-inf``, not NaN. Known mistakes are named: no shift, one shift for the whole
    tensor, the shift not added back, the ``-inf`` row, the mean instead of the sum.

    Example:
        >>> def my_logsumexp(x):
        ...     m = x.amax(-1, keepdim=True)
        ...     m = m.masked_fill(m.isneginf(), 0.0)
        ...     total = torch.exp(x - m).sum(-1, keepdim=True)
        ...     return (m + torch.log(total)).squeeze(-1)
        >>> check_logsumexp(my_logsumexp)  # doctest: +ELLIPSIS
        ✓ my_logsumexp: log-sum-exp of each row, stable (7 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _logsumexp,
        _lse_cases(),
        what="log-sum-exp of each row, stable",
        properties=[
            Property(
                "the log-sum-exp of a row is at least its largest score",
                _at_least_the_maximum,
            ),
        ],
        mistakes=[
            Mistake(
                "a row that is entirely -inf must give -inf, not NaN: shift it by 0 "
                "(-inf - -inf is NaN)",
                _lse_naive_shift,
            ),
            Mistake(
                "one shift for the whole tensor: rows far below it underflow; shift "
                "each row by its own maximum",
                _lse_global_max,
            ),
            Mistake(
                "the shift is not added back: log-sum-exp = m + log(sum(exp(x - m)))",
                _lse_shift_not_added_back,
            ),
            Mistake(
                "that is the log of the mean: sum the exponentials, do not average",
                _lse_of_mean,
            ),
            Mistake(
                "no shift: exp overflows (or underflows); subtract the row's maximum "
                "and add it back",
                _lse_unshifted,
            ),
        ],
    )
