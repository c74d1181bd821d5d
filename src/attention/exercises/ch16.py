"""Checkers for chapter 16's exercises: the forward kernel's inner step emulated in
PyTorch, the launch grid of each kernel, and the tiles a causal program visits.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch16
    ch16.check_kernel_block_step(my_block_step)

None of them needs Triton: they check the arithmetic and the bookkeeping of the
kernels in ``attention/efficient/triton_flash.py``, not the kernels themselves.
Shape legend: ``M`` queries of a block (``BLOCK_M``), ``N`` keys of a block
(``BLOCK_N``), ``d`` head size, ``b`` batch, ``h`` heads, ``i`` queries, ``j`` keys.
Mask convention: boolean, **True = may attend** (``visible``).
"""

from __future__ import annotations

import math

import torch

from ..efficient.tiled import flash_tile_kinds
from ._checker import Case, Mistake, Property, check, randn

__all__ = ["check_kernel_block_step", "check_launch_grid", "check_causal_tiles"]

LOG2E = 1.4426950408889634  # log2(e): e^x = 2^(x log2 e)
_INF = math.inf

# ------------------------------------------------------------------------ the step


def _block_step(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    """The reference: ``flash_forward_block``'s arithmetic, in base 2, in PyTorch."""
    qk = q @ k.transpose(-2, -1) * qk_scale  # (M, N), base-2 units
    qk = qk.masked_fill(~visible, -_INF)
    m_new = torch.maximum(m, qk.amax(-1))
    p = torch.exp2(qk - m_new[:, None])
    alpha = torch.exp2(m - m_new)
    return acc * alpha[:, None] + p @ v, m_new, l * alpha + p.sum(-1)


def _state(q, k, v, qk_scale, visible):
    """``(acc, m, l)`` after the blocks ``k``, ``v``, from their definition."""
    qk = (q @ k.transpose(-2, -1) * qk_scale).masked_fill(~visible, -_INF)
    m = qk.amax(-1)
    p = torch.exp2(qk - m[:, None])
    return p @ v, m, p.sum(-1)


def _step_cases() -> list[Case]:
    block_m, block_n, d = 4, 4, 8
    qk_scale = LOG2E / math.sqrt(d)
    every = torch.ones(block_m, block_n, dtype=torch.bool)
    start = (
        torch.zeros(block_m, d, dtype=torch.float64),
        torch.full((block_m,), -_INF, dtype=torch.float64),
        torch.zeros(block_m, dtype=torch.float64),
    )

    def after(seed, q, shift=0.0):
        k, v = randn(6, d, seed=seed), randn(6, d, seed=seed + 1)
        return _state(q, k + shift, v, qk_scale, torch.ones(4, 6, dtype=torch.bool))

    q = randn(block_m, d, seed=140)
    rows = torch.arange(block_m)[:, None]
    diagonal = rows >= torch.arange(block_n)[None, :]  # the causal diagonal block
    tail = every.clone()
    tail[:, 2:] = False  # keys 2 and 3 lie past the end of the sequence
    big = randn(block_m, d, seed=150, scale=300.0)
    return [
        Case(
            "the first block (m = -inf, l = 0, acc = 0)",
            (*start, q, randn(4, d, seed=141), randn(4, d, seed=142), qk_scale, every),
        ),
        Case(
            "a block that raises the maximum",
            (*after(143, q), q, randn(4, d, seed=145) + q[0], randn(4, d, seed=146))
            + (qk_scale, every),
        ),
        Case(
            "the diagonal block of a causal program (visible: rows >= columns)",
            (*after(147, q), q, randn(4, d, seed=148), randn(4, d, seed=149))
            + (qk_scale, diagonal),
        ),
        Case(
            "a last block whose keys 2 and 3 lie past the sequence",
            (*after(151, q), q, randn(4, d, seed=152), randn(4, d, seed=153))
            + (qk_scale, tail),
        ),
        Case(
            "large scores (queries times 300)",
            (*after(154, big), big, randn(4, d, seed=155), randn(4, d, seed=156))
            + (qk_scale, every),
            hint="an exponential overflowed: subtract the running maximum m_new",
        ),
    ]


def _step_base_e(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    qk = (q @ k.transpose(-2, -1) * qk_scale).masked_fill(~visible, -_INF)
    m_new = torch.maximum(m, qk.amax(-1))
    p, alpha = torch.exp(qk - m_new[:, None]), torch.exp(m - m_new)
    return acc * alpha[:, None] + p @ v, m_new, l * alpha + p.sum(-1)


def _step_unmasked(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    return _block_step(acc, m, l, q, k, v, qk_scale, torch.ones_like(visible))


def _step_acc_not_rescaled(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    new_acc, m_new, l_new = _block_step(acc, m, l, q, k, v, qk_scale, visible)
    alpha = torch.exp2(m - m_new)
    return new_acc - acc * alpha[:, None] + acc, m_new, l_new


def _step_scaled_twice(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    return _block_step(acc, m, l, q, k, v, qk_scale * LOG2E, visible)


def _step_unscaled(acc, m, l, q, k, v, qk_scale, visible):  # noqa: E741
    return _block_step(acc, m, l, q, k, v, 1.0, visible)


def check_kernel_block_step(fn) -> None:
    r"""Check ``fn(acc, m, l, q, k, v, qk_scale, visible) -> (acc, m, l)``: the
    forward kernel's inner step (``flash_forward_block``) emulated in PyTorch.

    ``q`` ``(M, d)`` is the program's block of queries, ``k`` and ``v`` ``(N, d)`` the
    key/value block folded in, ``acc`` ``(M, d)``, ``m`` and ``l`` ``(M,)`` the running
    state, ``visible`` a bool ``(M, N)`` (True = may attend: the causal mask and the
    end of the sequence). Like the kernel, work in base 2: ``qk_scale`` is the scale
    times :math:`\log_2 e`, so that :math:`2^{s \log_2 e} = e^{s}`:

    .. math::

        x = q k^\top \cdot \text{qk\_scale}\ (-\infty \text{ where not visible}), \quad
        m' = \max(m, \max_k x_k), \quad p = 2^{x - m'}, \quad \alpha = 2^{m - m'},

    then :math:`\text{acc}' = \alpha\, \text{acc} + p\, v` and
    :math:`l' = \alpha\, l + \sum_k p_k`. Return ``(acc_new, m_new, l_new)``, the
    kernel's order. The inputs (float64): the first block; a block that raises the
    maximum; the causal diagonal block; a block running past the sequence end; large
    scores. Known mistakes are named: ``exp`` with base-2 scores, ``visible`` ignored,
    the accumulator not rescaled, :math:`\log_2 e` applied twice, the scale forgotten.

    Example:
        >>> def my_block_step(acc, m, l, q, k, v, qk_scale, visible):
        ...     qk = (q @ k.T * qk_scale).masked_fill(~visible, -torch.inf)
        ...     m_new = torch.maximum(m, qk.amax(-1))
        ...     p, alpha = torch.exp2(qk - m_new[:, None]), torch.exp2(m - m_new)
        ...     return acc * alpha[:, None] + p @ v, m_new, l * alpha + p.sum(-1)
        >>> check_kernel_block_step(my_block_step)  # doctest: +ELLIPSIS
        ✓ my_block_step: the kernel's inner step, in base 2 (5 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _block_step,
        _step_cases(),
        what="the kernel's inner step, in base 2",
        outputs=("acc_new", "m_new", "l_new"),
        mistakes=[
            Mistake(
                "exp of base-2 scores: the scores carry log2(e) in qk_scale, so the "
                "kernel takes exp2 (2 ** x) for p and alpha",
                _step_base_e,
            ),
            Mistake(
                "visible is ignored: set the scores of keys that are not visible to "
                "-inf before the maximum",
                _step_unmasked,
            ),
            Mistake(
                "the accumulator is not rescaled: multiply acc by alpha = "
                "2 ** (m - m_new) before adding p @ v",
                _step_acc_not_rescaled,
            ),
            Mistake(
                "log2(e) is applied twice: qk_scale already holds it",
                _step_scaled_twice,
            ),
            Mistake(
                "the scores are not scaled: multiply q kᵀ by qk_scale",
                _step_unscaled,
            ),
        ],
    )


# ------------------------------------------------------------------------ the grid


def _grid(kernel: str, b: int, h: int, i: int, j: int, block_size: int):
    """The reference: ``(programs along axis 0, along axis 1)`` of a launch."""
    rows = j if kernel == "dkdv" else i
    return (-(-rows // block_size), b * h)


def _grid_floor(kernel, b, h, i, j, block_size):
    rows = j if kernel == "dkdv" else i
    return (rows // block_size, b * h)


def _grid_swapped(kernel, b, h, i, j, block_size):
    return tuple(reversed(_grid(kernel, b, h, i, j, block_size)))


def _grid_queries_only(kernel, b, h, i, j, block_size):
    return (-(-i // block_size), b * h)


def _grid_batch_only(kernel, b, h, i, j, block_size):
    return (_grid(kernel, b, h, i, j, block_size)[0], b)


def check_launch_grid(fn) -> None:
    r"""Check ``fn(kernel, b, h, i, j, block_size) -> (n0, n1)``: a launch's grid.

    ``kernel`` is one of ``"forward"``, ``"delta"``, ``"dkdv"`` and ``"dq"`` (the
    module's four kernels); ``b`` batch, ``h`` heads, ``i`` queries, ``j`` keys, one
    ``block_size`` for query and key blocks. Axis 1 of every grid is one program per
    batch·head; axis 0 is one program per block of the rows the kernel owns: query
    blocks for the forward, ``D`` and ``dQ`` kernels, key blocks for the ``dK``/``dV``
    kernel. A block may hang over the end: ``cdiv(n, B) = ceil(n / B)``. Return the two
    numbers as a tuple. The inputs: every kernel, ``i != j`` both ways, sizes that are
    multiples of the block and sizes that are not. Known mistakes are named: floor
    division, the axes swapped, the ``dK``/``dV`` kernel over query blocks, one program
    per batch instead of per batch·head.

    Example:
        >>> def my_grid(kernel, b, h, i, j, block_size):
        ...     rows = j if kernel == "dkdv" else i
        ...     return (-(-rows // block_size), b * h)
        >>> check_launch_grid(my_grid)  # doctest: +ELLIPSIS
        ✓ my_grid: programs per launch, each kernel (8 inputs, exactly)
    """
    __tracebackhide__ = True
    cases = [
        Case(
            f"{kernel}, b = 2, h = 3, i = 40, j = 20, B = 16",
            (kernel, 2, 3, 40, 20, 16),
        )
        for kernel in ("forward", "delta", "dkdv", "dq")
    ] + [
        Case("dkdv, b = 1, h = 2, i = 45, j = 70, B = 16", ("dkdv", 1, 2, 45, 70, 16)),
        Case("dq, b = 1, h = 2, i = 45, j = 70, B = 16", ("dq", 1, 2, 45, 70, 16)),
        Case(
            "forward, b = 4, h = 8, i = j = 1024, B = 64",
            ("forward", 4, 8, 1024, 1024, 64),
        ),
        Case(
            "dkdv, b = 4, h = 8, i = j = 1024, B = 64", ("dkdv", 4, 8, 1024, 1024, 64)
        ),
    ]
    check(
        fn,
        _grid,
        cases,
        what="programs per launch, each kernel",
        outputs=("axis 0", "axis 1"),
        atol=0.0,
        mistakes=[
            Mistake(
                "floor division drops the last, partial block: use cdiv, "
                "-(-n // block_size)",
                _grid_floor,
            ),
            Mistake(
                "the axes are swapped: axis 0 counts blocks, axis 1 batch·head",
                _grid_swapped,
            ),
            Mistake(
                "the dK/dV kernel runs one program per key block: its axis 0 is "
                "cdiv(j, block_size)",
                _grid_queries_only,
            ),
            Mistake(
                "axis 1 must count every batch·head pair, b * h",
                _grid_batch_only,
            ),
        ],
    )


# ------------------------------------------------------------------------ the tiles


def _causal_tiles(num_queries, num_keys, block_size):
    return flash_tile_kinds(num_queries, num_keys, block_size, is_causal=True)


def _tiles_not_causal(num_queries, num_keys, block_size):
    return flash_tile_kinds(num_queries, num_keys, block_size)


def _tiles_without_mask(num_queries, num_keys, block_size):
    kinds = _causal_tiles(num_queries, num_keys, block_size)
    return kinds.clamp(max=1)


def _tiles_masking_the_future(num_queries, num_keys, block_size):
    kinds = _causal_tiles(num_queries, num_keys, block_size)
    return torch.where(kinds == 0, 2, kinds)


def _tiles_off_by_one(num_queries, num_keys, block_size):
    t_q, t_k = -(-num_queries // block_size), -(-num_keys // block_size)
    m, n = torch.arange(t_q)[:, None], torch.arange(t_k)[None, :]
    return torch.where(n <= m, 1, torch.where(n == m + 1, 2, 0))


def _one_masked_tile_per_row(out, *args):
    if out.dtype != torch.long or out.dim() != 2:
        return True  # the dtype and shape are reported first
    return (out == 2).sum(-1) <= 1


def check_causal_tiles(fn) -> None:
    r"""Check ``fn(num_queries, num_keys, block_size)``: the tiles a causal forward
    kernel visits, as a long tensor ``(cdiv(i, B), cdiv(j, B))``.

    Row ``m`` is the program of query block ``m`` (rows ``mB .. mB + B - 1``), column
    ``n`` key block ``n``. The kernel's loop bounds decide: the key blocks that start
    before ``min(mB, j)`` are loaded with no mask (``1``), the blocks from there up to
    ``min((m + 1)B, j)`` (the diagonal block) are loaded and masked (``2``), the rest
    are never loaded (``0``). This is
    :func:`~attention.efficient.tiled.flash_tile_kinds` with ``is_causal=True``. The
    inputs: square and not, lengths that are not multiples of the block, more queries
    than keys (late programs mask nothing), one short query block. Known mistakes are
    named: the causal mask ignored, the diagonal left unmasked, the future blocks
    loaded, the diagonal one block to the right.

    Example:
        >>> def my_causal_tiles(num_queries, num_keys, block_size):
        ...     t_q = -(-num_queries // block_size)
        ...     starts = torch.arange(-(-num_keys // block_size)) * block_size
        ...     rows = torch.arange(t_q)[:, None] * block_size
        ...     below = rows.clamp(max=num_keys)
        ...     end = (rows + block_size).clamp(max=num_keys)
        ...     masked = (starts >= below) & (starts < end)
        ...     return torch.where(starts < below, 1, torch.where(masked, 2, 0))
        >>> check_causal_tiles(my_causal_tiles)  # doctest: +ELLIPSIS
        ✓ my_causal_tiles: causal tiles: unmasked, masked, skipped (6 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        _causal_tiles,
        [
            Case("i = j = 64, B = 16", (64, 64, 16)),
            Case("i = j = 45, B = 16 (a last block of 13)", (45, 45, 16)),
            Case("i = 45, j = 70, B = 16", (45, 70, 16)),
            Case("i = 70, j = 45, B = 16: more queries than keys", (70, 45, 16)),
            Case("i = j = 7, B = 3", (7, 7, 3)),
            Case("i = 5, j = 40, B = 8: one query block", (5, 40, 8)),
        ],
        what="causal tiles: unmasked, masked, skipped",
        properties=[
            Property(
                "a program masks at most one key block, the diagonal",
                _one_masked_tile_per_row,
            )
        ],
        mistakes=[
            Mistake(
                "the causal mask is ignored: blocks after the diagonal hold only "
                "future keys and are never loaded (0)",
                _tiles_not_causal,
            ),
            Mistake(
                "the diagonal block is left unmasked: it holds keys after some of the "
                "program's queries, so it is loaded with the mask (2)",
                _tiles_without_mask,
            ),
            Mistake(
                "the blocks after the diagonal are loaded: they hold only future keys "
                "(0, never loaded)",
                _tiles_masking_the_future,
            ),
            Mistake(
                "the diagonal is one block to the right: program m masks key block m "
                "and loads only the blocks before it whole",
                _tiles_off_by_one,
            ),
        ],
    )
