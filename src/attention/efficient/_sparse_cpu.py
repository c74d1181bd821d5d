"""The CPU fast path of block-sparse attention: whole runs of kept blocks, no gather.

Private to :func:`attention.efficient.sparse.block_sparse_attention`, which calls
:func:`block_sparse_runs` first and takes its readable gather path when this returns
``None``. Chapter 13 teaches the gather path; this module is what makes the same result
fast for inference on a CPU, and ``benchmarks/sparse.py`` measures it.

Shape legend: ``z`` the batch and head dims merged into one, ``i`` query positions,
``j`` key positions, ``d`` query/key size, ``e`` value size (here ``e = d``), ``B`` the
block size, ``g`` a group of query blocks.

The idea: cut every layout row into *runs* of consecutive kept key blocks. The keys of a
run are one contiguous slice, so nothing is gathered: query blocks that keep the same
run (a global column) are stacked against that slice, and query blocks whose run slides
along with them (a band) are fed as a strided view with one key tile per query block,
each group in one call of PyTorch's fused attention kernel. The kernel also returns each
query's log-sum-exp ``l`` of its scores, so a row with several runs merges its partial
results exactly: with ``L = logaddexp(l_1, l_2)``,
``o = exp(l_1 - L) o_1 + exp(l_2 - L) o_2``.
"""

from __future__ import annotations

import collections
import functools

import torch
import torch.nn.functional as F
from torch import Tensor

# PyTorch's fused CPU attention kernel, called directly because it also returns the
# log-sum-exp of each query's scores, which lets partial results over disjoint key sets
# be merged exactly. It is a private op: where it is missing (or fails), the caller's
# gather path is used instead.
_FLASH_CPU = getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None
)

# The run path makes a few kernel calls per distinct run pattern; a layout scattered
# into many short runs (a random one) is faster through the gather path. Use the run
# path while it needs at most this many kernel calls per query block (plus a few).
MAX_CALLS_PER_ROW = 2

# Plans of layouts up to this many blocks are cached (a model reuses one layout per
# call).
_CACHE_MAX_BLOCKS = 1 << 16


def block_sparse_runs(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    layout: Tensor,
    block_size: int,
    scale: float,
    *,
    max_calls_per_row: int = MAX_CALLS_PER_ROW,
) -> Tensor | None:
    """Block-sparse attention through whole runs of kept blocks, or ``None`` where it
    does not apply.

    Applies on the CPU to float32/64 inputs with ``d == e > 0`` and no autograd graph
    (the kernel's backward ignores the log-sum-exp that the merge uses), when the op
    exists and the plan needs at most ``max_calls_per_row`` kernel calls per query block
    (plus 4).

    Args:
        query: ``(..., i, d)``; key ``(..., j, d)``; value ``(..., j, d)``, batch dims
            already broadcast to one shape.
        layout: ``(ceil(i / B), ceil(j / B))`` boolean, True = the tile is computed.
        block_size: ``B``, at most ``max(i, j)``.
        scale: multiplies the scores.

    Returns:
        ``(..., i, d)``, or ``None``.
    """
    if not (_applies(query, key, value) and _finite_scores(query, key, scale)):
        return None
    i, j = query.shape[-2], key.shape[-2]
    plan = _run_plan(layout, block_size, i, j)
    if len(plan) > max_calls_per_row * layout.shape[0] + 4:
        return None
    try:
        return _attend_runs(query, key, value, plan, block_size, layout.shape[0], scale)
    except (RuntimeError, TypeError, NotImplementedError):  # the private op changed
        return None


def _applies(query: Tensor, key: Tensor, value: Tensor) -> bool:
    needs_grad = torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
    )
    return (
        _FLASH_CPU is not None
        and not needs_grad
        and query.device.type == "cpu"
        and query.dtype in (torch.float32, torch.float64)
        and 0
        < query.shape[-1]
        == value.shape[-1]  # the fused kernel wants one head size
        and query.shape[-2] > 0
        and key.shape[-2] > 0
    )


def _finite_scores(query: Tensor, key: Tensor, scale: float) -> bool:
    """Whether every score is surely finite: ``max|q| max|k| d |s|`` below the dtype's
    largest number (False for NaN or infinite inputs).

    The fused kernel gives a row whose scores in one call are all ``-inf`` (an infinite
    key, or a product that overflows) a log-sum-exp of 0 instead of ``-inf``, so the
    merge would count that call's zero output as if it held weight. Such inputs take the
    gather path, which gives the dense reference's result.
    """
    with torch.no_grad():
        bound = (
            query.abs().amax().to(torch.float64)
            * key.abs().amax().to(torch.float64)
            * query.shape[-1]
            * abs(scale)
        )
        return bool(bound < torch.finfo(query.dtype).max)


def _layout_runs(layout: Tensor) -> list[tuple[int, int, int]]:
    """The maximal runs of consecutive True in each layout row:
    ``(row, first column, length)``."""
    edges = F.pad(layout.to(torch.int8), (1, 1)).diff(
        dim=-1
    )  # +1 at a start, -1 past an end
    starts, ends = (
        (edges == 1).nonzero(),
        (edges == -1).nonzero(),
    )  # both sorted row-major
    return list(
        zip(
            starts[:, 0].tolist(),
            starts[:, 1].tolist(),
            (ends[:, 1] - starts[:, 1]).tolist(),
            strict=True,
        )
    )


def _run_plan(layout: Tensor, B: int, i: int, j: int) -> tuple[tuple, ...]:
    """Cover the kept tiles with kernel calls that read keys and queries without copying
    them.

    Every run of ``c`` kept key blocks starting at block ``s`` is one contiguous slice
    of the keys. Two kinds of call:

    - ``("shared", rows, s, c)``: several query blocks keep the same run (a global
      column, a full row pattern): their queries are stacked against that one key slice.
    - ``("diagonal", r0, g, s0, c)``: query blocks ``r0 + t`` (``t < g``) keep the run
      that starts at block ``s0 + t`` (a band): a strided view of the keys with one tile
      per query block, a step of ``B`` positions between tiles. Grouped so that every
      tile of a call has the same number of queries and keys (the partial last blocks go
      apart).

    A run that fits neither pattern but is a band window plus shared runs (the rows
    where the band meets a global column) is cut into those pieces, which saves kernel
    calls. The plan depends only on the layout and the sizes, so a small layout's plan
    is cached.
    """
    layout = layout.cpu()
    if layout.numel() > _CACHE_MAX_BLOCKS:
        return _plan(layout, B, i, j)
    return _plan_cached(layout.numpy().tobytes(), tuple(layout.shape), B, i, j)


@functools.lru_cache(maxsize=64)
def _plan_cached(
    layout_bytes: bytes, shape: tuple[int, int], B: int, i: int, j: int
) -> tuple[tuple, ...]:
    return _plan(
        torch.frombuffer(bytearray(layout_bytes), dtype=torch.bool).view(shape), B, i, j
    )


def _plan(layout: Tensor, B: int, i: int, j: int) -> tuple[tuple, ...]:
    runs = _layout_runs(layout)
    plan = _plan_from_runs(runs, B, i, j)
    # Key blocks that every query block keeps (a global column): cut them out of every
    # row, so that one call covers all the queries; its output then is the output
    # buffer. Kept when it needs no more calls.
    columns = [(s, c) for _, s, c in _layout_runs(layout.all(dim=0, keepdim=True))]
    if len(layout) > 1 and columns:
        s, c = columns[0]
        cut = []
        for r, s0, c0 in runs:
            if s0 <= s and s + c <= s0 + c0:
                cut += [
                    (r, x, n)
                    for x, n in ((s0, s - s0), (s, c), (s + c, s0 + c0 - s - c))
                    if n > 0
                ]
            else:
                cut.append((r, s0, c0))
        whole = _plan_from_runs(cut, B, i, j)
        if len(whole) <= len(plan):
            first = next(p for p in whole if p[0] == "shared" and p[2:] == (s, c))
            plan = (first,) + tuple(p for p in whole if p is not first)
    return plan


def _plan_from_runs(
    runs: list[tuple[int, int, int]], B: int, i: int, j: int
) -> tuple[tuple, ...]:
    """Group ``(row, first column, length)`` runs into the calls of
    :func:`_run_plan`."""
    shared = collections.Counter((s, c) for _, s, c in runs)
    bands = collections.Counter((c, s - r) for r, s, c in runs)
    (width, offset), most = bands.most_common(1)[0] if runs else ((0, 0), 0)
    if most > 1:  # cut the odd runs that are the common band window plus shared runs
        cut = []
        for r, s, c in runs:
            lo, hi = r + offset, r + offset + width  # this row's band window
            rest = ((s, lo - s), (hi, s + c - hi))
            if (
                shared[s, c] == 1
                and bands[c, s - r] == 1
                and s <= lo
                and hi <= s + c
                and all(n == 0 or shared[x, n] > 1 for x, n in rest)
            ):
                cut += [(r, x, n) for x, n in (rest[0], (lo, width), rest[1]) if n > 0]
            else:
                cut.append((r, s, c))
        runs = cut

    by_run: dict[tuple[int, int], list[int]] = {}
    for r, s, c in runs:
        by_run.setdefault((s, c), []).append(r)
    plan: list[tuple] = []
    diagonal: dict[tuple[int, int, bool, bool], list[int]] = {}
    for (s, c), rows in by_run.items():
        if len(rows) > 1:
            plan.append(("shared", tuple(rows), s, c))
        else:
            r = rows[0]
            diagonal.setdefault(
                (c, s - r, (r + 1) * B <= i, (s + c) * B <= j), []
            ).append(r)
    for (c, off, _, _), rows in diagonal.items():
        rows.sort()
        first = 0
        for t in range(1, len(rows) + 1):  # split into stretches of consecutive rows
            if t == len(rows) or rows[t] != rows[t - 1] + 1:
                plan.append(("diagonal", rows[first], t - first, rows[first] + off, c))
                first = t
    return tuple(plan)


def _attend_runs(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    plan: tuple[tuple, ...],
    B: int,
    num_rows: int,
    scale: float,
) -> Tensor:
    """Block-sparse attention from the calls of :func:`_run_plan`, merged exactly.

    Each call returns, for its queries, the attention ``o`` over its keys and the
    log-sum-exp ``l`` of the scores. A query block whose layout row has several runs
    gets one partial result per run; the exact result over the union of the key sets is
    ``exp(l_1 - L) o_1 + exp(l_2 - L) o_2`` with ``L = logaddexp(l_1, l_2)``, that is
    ``lerp(o_1, o_2, sigmoid(l_2 - l_1))``, written straight into the output.
    """
    flash = _FLASH_CPU
    assert flash is not None, "the caller uses this path only where the kernel exists"
    batch, i, j, e = query.shape[:-2], query.shape[-2], key.shape[-2], value.shape[-1]
    # (z, n, d) views (a copy only if the batch dims cannot be merged), rows contiguous.
    q, k, v = (x.reshape(-1, *x.shape[-2:]) for x in (query, key, value))
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    z = q.shape[0]

    def tiles(x: Tensor, first: int, g: int, length: int) -> Tensor:
        """``(z, g, length, .)`` view: tile ``t`` is positions ``(first + t) B ...``, no
        copy."""
        return x.as_strided(
            (z, g, length, x.shape[-1]),
            (x.stride(0), B * x.stride(1), x.stride(1), 1),
            x.storage_offset() + first * B * x.stride(1),
        )

    # 1. One kernel call per entry of the plan.
    results = []  # (o (z, p, e), l (z, p)) per call
    parts: list[list[tuple[int, int]]] = [
        [] for _ in range(num_rows)
    ]  # (call, offset) per block
    for kind, *spec in plan:
        if (
            kind == "shared"
        ):  # (z, 1, g*B, d) queries against one (z, 1, T, d) key slice
            rows, s, c = spec
            if rows[-1] - rows[0] + 1 == len(rows):
                qs = q[:, rows[0] * B : min((rows[-1] + 1) * B, i)]
            else:
                pos = (
                    torch.tensor(rows, device=q.device)[:, None] * B
                    + torch.arange(B, device=q.device)
                ).flatten()
                qs = q.index_select(1, pos[pos < i])
            keys = slice(s * B, min((s + c) * B, j))
            o, lse_o = flash(
                qs[:, None],
                k[:, None, keys],
                v[:, None, keys],
                dropout_p=0.0,
                is_causal=False,
                attn_mask=None,
                scale=scale,
            )[:2]
            o, lse_o = o[:, 0], lse_o[:, 0]
        else:
            # (z, g, B, d) query tiles against (z, g, T, d) key tiles, both strided
            # views
            r0, g, s0, c = spec
            rows = range(r0, r0 + g)
            size = min(B, i - r0 * B)  # only a lone last block can be partial
            t = min((s0 + c) * B, j) - s0 * B
            o, lse_o = flash(
                tiles(q, r0, g, size),
                tiles(k, s0, g, t),
                tiles(v, s0, g, t),
                dropout_p=0.0,
                is_causal=False,
                attn_mask=None,
                scale=scale,
            )[:2]
            o, lse_o = o.reshape(z, g * size, e), lse_o.reshape(z, g * size)
        for n, r in enumerate(rows):
            parts[r].append((len(results), n * B))
        results.append((o, lse_o))

    # 2. Merge, a stretch of query blocks fed by the same calls at a time. A first call
    # that covers every query (a global column) already is the output buffer.
    inplace = bool(plan) and plan[0][0] == "shared" and len(plan[0][1]) == num_rows
    out = results[0][0] if inplace else q.new_empty(z, i, e)
    r = 0
    while r < num_rows:
        end = r + 1
        while (
            end < num_rows
            and len(parts[end]) == len(parts[r])
            and all(
                b == (n, p + (end - r) * B)
                for (n, p), b in zip(parts[r], parts[end], strict=True)
            )
        ):
            end += 1
        length = min(end * B, i) - r * B
        dst = out[:, r * B : r * B + length]  # (z, length, e)
        pieces = [
            (results[n][0][:, p : p + length], results[n][1][:, p : p + length])
            for n, p in parts[r]
        ]
        if not pieces:  # rows that attend to nothing are zero, as in the reference
            dst.zero_()
        elif inplace:  # dst holds pieces[0] already
            _merge_into(dst, pieces[0][1], pieces[1:])
        elif len(pieces) == 1:
            dst.copy_(pieces[0][0])
        else:
            (o1, l1), (o2, l2) = pieces[:2]
            torch.lerp(o1, o2, torch.sigmoid(l2 - l1).unsqueeze_(-1), out=dst)
            if len(pieces) > 2:
                _merge_into(dst, torch.logaddexp(l1, l2), pieces[2:])
        r = end
    return out.reshape(*batch, i, e)


def _merge_into(dst: Tensor, lse: Tensor, rest: list[tuple[Tensor, Tensor]]) -> None:
    """Fold the partial results ``(o_n, l_n)`` of ``rest`` into ``dst``, whose
    log-sum-exp is ``lse``."""
    for n, (o_n, l_n) in enumerate(rest, start=1):
        dst.lerp_(o_n, torch.sigmoid(l_n - lse).unsqueeze_(-1))
        if n < len(rest):
            lse = torch.logaddexp(lse, l_n)
