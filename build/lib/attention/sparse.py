"""Sparse attention that computes only the kept blocks (taught in chapter 11).

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads, ``i`` query
positions, ``j`` key positions, ``d`` query/key size, ``e`` value size; ``B`` is a block
size, ``c`` a query block, ``g`` a group of query blocks, ``t`` a key inside
a gathered tile.

Mask convention: boolean, **True = may attend**. Each function here is exactly the
dense reference :func:`attention.scaled_dot_product_attention` with a mask from
:mod:`attention.masks` (:func:`~attention.masks.sliding_window_mask`,
:func:`~attention.masks.block_sparse_mask`), but never builds the ``(i, j)`` scores:
time and memory grow with the number of kept entries, linearly in ``n`` for a fixed
window or a fixed number of kept blocks per row.
"""

from __future__ import annotations

import collections
import functools
import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import broadcast_shapes, check_int, check_qkv, check_tensor
from .masks import global_tokens_mask

__all__ = ["sliding_window_attention", "block_sparse_attention", "local_global_layout"]


def _check_qkv(query, key, value, scale, *, same_length: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Boundary checks shared by both kernels; returns q, k, v broadcast over the batch dims."""
    check_qkv(query, key, value)
    if same_length and query.shape[-2] != key.shape[-2]:
        raise ValueError(
            "sliding-window attention is self-attention: query and key must have the same "
            f"number of positions, got {query.shape[-2]} and {key.shape[-2]}"
        )
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    batch = broadcast_shapes(
        "the batch dims of query, key and value",
        tuple(query.shape[:-2]), tuple(key.shape[:-2]), tuple(value.shape[:-2]),
    )
    return (
        query.expand(*batch, *query.shape[-2:]),
        key.expand(*batch, *key.shape[-2:]),
        value.expand(*batch, *value.shape[-2:]),
    )


def _pad_positions(x: Tensor, before: int, after: int) -> Tensor:
    """Zero-pad the positions axis (-2) of ``(..., n, d)`` (no copy when there is no padding)."""
    if before == 0 and after == 0:
        return x
    return F.pad(x, (0, 0, before, after))


def _blocks_per_chunk(elements_per_block: int) -> int:
    """How many blocks to process at once so each step's temporaries stay near 2**23 numbers.

    This bounds the peak memory of one step (the scores of the gathered tiles) while
    keeping the steps few and large, which is what a CPU runs fastest; the result does
    not depend on the step.
    """
    return max(1, _CHUNK_ELEMENTS // max(1, elements_per_block))


_CHUNK_ELEMENTS = 1 << 23


def _tile_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    """Dense attention inside gathered tiles: ``softmax(q k^T * scale, masked) v``.

    Args:
        q: ``(..., c, B, d)`` query blocks.
        k: ``(..., c, T, d)`` the keys each block may see.
        v: ``(..., c, T, e)``.
        mask: boolean, broadcastable to ``(c, B, T)``, True = may attend; every row must
            keep at least one key. ``None`` keeps all.

    Returns:
        ``(..., c, B, e)``.
    """
    # The tile attention itself is PyTorch's fused kernel: it keeps each tile's scores in
    # cache instead of writing them to memory. (The fused kernel wants 4-D inputs, so the
    # leading dims are flattened into one.)
    lead = q.shape[:-3]
    to4d = (lambda t: t.reshape(lead.numel(), *t.shape[-3:])) if q.dim() != 4 else (lambda t: t)
    out = F.scaled_dot_product_attention(to4d(q), to4d(k), to4d(v), attn_mask=mask, scale=scale)
    return out.reshape(*lead, *out.shape[-3:])  # (..., c, B, e)


def sliding_window_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    window: int,
    is_causal: bool = False,
    scale: float | None = None,
    block_size: int | None = None,
) -> Tensor:
    r"""Local attention in :math:`O(n \cdot w)` time and memory, equal to dense attention + band mask.

    Query :math:`i` attends to the keys :math:`j` with :math:`|i - j| \le w` (and
    :math:`j \le i` when ``is_causal``), exactly as
    ``scaled_dot_product_attention(q, k, v, attn_mask=sliding_window_mask(n, w, is_causal=...))``.

    How: the queries are cut into blocks of ``B`` positions. Block ``c`` can only see
    keys in blocks ``c - r ... c + r`` with ``r = ceil(w / B)`` (causal: ``c - r ... c``),
    so those keys are gathered into one tile of ``T = (2r + 1) B`` keys (causal:
    ``(r + 1) B``; a strided
    ``unfold`` of the zero-padded keys, no copy of the ``(i, j)`` matrix), the
    ``(B, T)`` scores of all blocks are computed with one batched matmul, and a band mask
    (the same for every block) plus a mask for the padding hides what the dense mask
    hides (a 0 / -inf bias added to the scores; only the two end tiles need more).
    The work is :math:`n \cdot T \cdot (d + e)`: linear in ``n``.

    Args:
        query: ``(..., n, d)``.
        key: ``(..., n, d)``.
        value: ``(..., n, e)``. Leading dims broadcast.
        window: ``w >= 0``, neighbours visible on each side.
        is_causal: also hide keys ``j > i``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        block_size: query block ``B >= 1``; default ``min(n, max(w, 32))``. Any ``B``
            gives the same result; ``B`` close to ``w`` wastes least work.

    Returns:
        ``(..., n, e)``. Every query sees at least itself, so no row is empty.

    Example:
        >>> q = k = torch.zeros(1, 4, 2); v = torch.arange(4.0).reshape(1, 4, 1)
        >>> sliding_window_attention(q, k, v, window=1).flatten().tolist()  # neighbour means
        [0.5, 1.0, 2.0, 2.5]
    """
    query, key, value = _check_qkv(query, key, value, scale, same_length=True)
    window = check_int("window", window, minimum=0)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    n, d = query.shape[-2], query.shape[-1]
    if block_size is None:
        block_size = max(1, min(n, max(window, 32)))
    B = check_int("block_size", block_size, minimum=1)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if n == 0:
        return query.new_zeros(*query.shape[:-1], value.shape[-1])

    nb = -(-n // B)  # number of query blocks
    r = min(-(-window // B), nb - 1)  # neighbouring blocks needed on each side
    left, right = r * B, (0 if is_causal else r * B)
    T = left + B + right  # keys per tile
    pad = nb * B - n

    q = _pad_positions(query, 0, pad).unflatten(-2, (nb, B))  # (..., c, B, d)
    # Tile c holds keys c*B - left ... c*B - left + T - 1: a strided view, no copy yet.
    k = _pad_positions(key, left, pad + right).unfold(-2, T, B)  # (..., c, d, T)
    v = _pad_positions(value, left, pad + right).unfold(-2, T, B)  # (..., c, e, T)

    # Query a of block c is position c*B + a; key t of tile c is c*B - left + t, so the
    # offset "query minus key" is the same in every block: one (B, T) band, added to the
    # scores as 0 / -inf.
    a = torch.arange(B, device=query.device)
    t = torch.arange(T, device=query.device)
    offset = a[:, None] + left - t[None, :]  # (B, T)
    band = offset.abs() <= window
    if is_causal:
        band = band & (offset >= 0)
    band_bias = torch.zeros(B, T, dtype=query.dtype, device=query.device)
    band_bias = band_bias.masked_fill(~band, float("-inf"))  # (B, T)
    # Only the tiles at the two ends reach past the sequence (into the zero padding).
    key_pos = torch.arange(nb, device=query.device)[:, None] * B - left + t  # (c, T)
    outside = (key_pos < 0) | (key_pos >= n)  # (c, T)
    edges = outside.any(dim=-1).nonzero().flatten().tolist()

    outs = []
    step = _blocks_per_chunk(query.shape[:-2].numel() * B * (T + d + value.shape[-1]))
    for c0 in range(0, nb, step):  # a few blocks at a time: bounded temporaries
        blocks = slice(c0, min(nb, c0 + step))
        scores = (q[..., blocks, :, :] * scale) @ k[..., blocks, :, :]  # (..., c, B, T)
        scores += band_bias  # in place: the matmul's backward does not need its output
        for c in edges:
            if c0 <= c < blocks.stop:
                tile = scores[..., c - c0, :, :]  # (..., B, T)
                tile.masked_fill_(outside[c], float("-inf"))
                # padding queries (positions >= n) may see no key at all: give them
                # finite scores; their outputs are cut off below
                dead = ~(band & ~outside[c]).any(dim=-1, keepdim=True)  # (B, 1)
                tile.masked_fill_(dead, 0.0)
        weights = torch.softmax(scores, dim=-1)  # (..., c, B, T)
        outs.append(weights @ v[..., blocks, :, :].transpose(-1, -2))  # (..., c, B, e)
    out = torch.cat(outs, dim=-3)  # (..., c, B, e)
    return out.flatten(-3, -2)[..., :n, :]  # (..., n, e)


def _check_layout(layout, block_size: int, i: int, j: int) -> None:
    check_tensor("layout", layout)
    if layout.dtype != torch.bool:
        raise TypeError(f"layout must be boolean (True = block computed), got {layout.dtype}")
    expected = (-(-i // block_size), -(-j // block_size))
    if tuple(layout.shape) != expected:
        raise ValueError(
            f"layout must have shape (ceil(i/B), ceil(j/B)) = {expected} for i={i} queries, "
            f"j={j} keys and block_size B={block_size}, got {tuple(layout.shape)}"
        )


# PyTorch's fused CPU attention kernel, called directly because it also returns the
# log-sum-exp of each query's scores, which lets partial results over disjoint key sets be
# merged exactly. (A private op: if it is missing, the gather path below is used.)
_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)

# The run path makes a few kernel calls per distinct run pattern; a layout scattered into
# many short runs (a random one) is faster through the gather path. Use the run path while
# it needs at most this many kernel calls per query block (plus a few).
_MAX_RUN_CALLS_PER_ROW = 2


def _layout_runs(layout: Tensor) -> list[tuple[int, int, int]]:
    """The maximal runs of consecutive True in each layout row: ``(row, first column, length)``."""
    edges = F.pad(layout.to(torch.int8), (1, 1)).diff(dim=-1)  # +1 at a start, -1 past an end
    starts, ends = (edges == 1).nonzero(), (edges == -1).nonzero()  # both sorted row-major
    return list(zip(starts[:, 0].tolist(), starts[:, 1].tolist(),
                    (ends[:, 1] - starts[:, 1]).tolist(), strict=True))


def _run_plan(layout: Tensor, B: int, i: int, j: int) -> tuple[tuple, ...]:
    """Cover the kept tiles with kernel calls that read keys and queries without copying them.

    Every run of ``c`` kept key blocks starting at block ``s`` is one contiguous slice of the
    keys. Two kinds of call:

    - ``("shared", rows, s, c)``: several query blocks keep the same run (a global column,
      a full row pattern): their queries are stacked against that one key slice.
    - ``("diagonal", r0, g, s0, c)``: query blocks ``r0 + t`` (``t < g``) keep the run that
      starts at block ``s0 + t`` (a band): a strided view of the keys with one tile per query
      block, a step of ``B`` positions between tiles. Grouped so that every tile of a call has
      the same number of queries and keys (the partial last blocks go apart).

    A run that fits neither pattern but is a band window plus shared runs (the rows where
    the band meets a global column) is cut into those pieces, which saves kernel calls.
    The plan depends only on the layout and the sizes, so it is cached.
    """
    layout = layout.cpu()
    return _run_plan_cached(layout.numpy().tobytes(), tuple(layout.shape), B, i, j)


@functools.lru_cache(maxsize=64)
def _run_plan_cached(layout_bytes: bytes, shape: tuple[int, int], B: int, i: int,
                     j: int) -> tuple[tuple, ...]:
    layout = torch.frombuffer(bytearray(layout_bytes), dtype=torch.bool).view(shape)
    runs = _layout_runs(layout)
    plan = _plan_from_runs(runs, B, i, j)
    # Key blocks that every query block keeps (a global column): cut them out of every
    # row, so that one call covers all the queries; its output then is the output buffer.
    # Kept when it needs no more calls.
    columns = [(s, c) for _, s, c in _layout_runs(layout.all(dim=0, keepdim=True))]
    if len(layout) > 1 and columns:
        s, c = columns[0]
        cut = []
        for r, s0, c0 in runs:
            if s0 <= s and s + c <= s0 + c0:
                cut += [(r, x, n) for x, n in ((s0, s - s0), (s, c), (s + c, s0 + c0 - s - c))
                        if n > 0]
            else:
                cut.append((r, s0, c0))
        whole = _plan_from_runs(cut, B, i, j)
        if len(whole) <= len(plan):
            first = next(p for p in whole if p[0] == "shared" and p[2:] == (s, c))
            plan = (first,) + tuple(p for p in whole if p is not first)
    return plan


def _plan_from_runs(runs: list[tuple[int, int, int]], B: int, i: int,
                    j: int) -> tuple[tuple, ...]:
    """Group ``(row, first column, length)`` runs into the calls of :func:`_run_plan`."""
    shared = collections.Counter((s, c) for _, s, c in runs)
    bands = collections.Counter((c, s - r) for r, s, c in runs)
    (width, offset), most = bands.most_common(1)[0] if runs else ((0, 0), 0)
    if most > 1:  # cut the odd runs that are the common band window plus shared runs
        cut = []
        for r, s, c in runs:
            lo, hi = r + offset, r + offset + width  # this row's band window
            rest = ((s, lo - s), (hi, s + c - hi))
            if (shared[s, c] == 1 and bands[c, s - r] == 1 and s <= lo and hi <= s + c
                    and all(n == 0 or shared[x, n] > 1 for x, n in rest)):
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
            diagonal.setdefault((c, s - r, (r + 1) * B <= i, (s + c) * B <= j), []).append(r)
    for (c, off, _, _), rows in diagonal.items():
        rows.sort()
        first = 0
        for t in range(1, len(rows) + 1):  # split into stretches of consecutive rows
            if t == len(rows) or rows[t] != rows[t - 1] + 1:
                plan.append(("diagonal", rows[first], t - first, rows[first] + off, c))
                first = t
    return tuple(plan)


def _use_runs(query: Tensor, key: Tensor, value: Tensor) -> bool:
    """Whether the zero-copy run path applies: CPU, float32/64, d == e, no autograd graph."""
    needs_grad = torch.is_grad_enabled() and (
        query.requires_grad or key.requires_grad or value.requires_grad
    )
    return (
        _FLASH_CPU is not None
        and not needs_grad  # the kernel's backward ignores the log-sum-exp the merge uses
        and query.device.type == "cpu"
        and query.dtype in (torch.float32, torch.float64)
        and query.shape[-1] == value.shape[-1]  # the fused kernel wants one head size
        and query.shape[-2] > 0
        and key.shape[-2] > 0
    )


def _block_sparse_runs(
    query: Tensor, key: Tensor, value: Tensor, plan: list[tuple], B: int, n_rows: int,
    scale: float,
) -> Tensor:
    """:func:`block_sparse_attention` from the calls of :func:`_run_plan`, merged exactly.

    Each call returns, for its queries, the attention ``o`` over its keys and the
    log-sum-exp ``l`` of the scores. A query block whose layout row has several runs gets
    one partial result per run; the exact result over the union of the key sets is
    ``exp(l_1 - L) o_1 + exp(l_2 - L) o_2`` with ``L = logaddexp(l_1, l_2)``, that is
    ``lerp(o_1, o_2, sigmoid(l_2 - l_1))``, written straight into the output.
    """
    batch, i, j, e = query.shape[:-2], query.shape[-2], key.shape[-2], value.shape[-1]
    # (z, n, d) views (a copy only if the batch dims cannot be merged), rows contiguous.
    q, k, v = (x.reshape(-1, *x.shape[-2:]) for x in (query, key, value))
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    z = q.shape[0]

    def tiles(x: Tensor, first: int, g: int, length: int) -> Tensor:
        """``(z, g, length, .)`` view: tile ``t`` is positions ``(first + t) B ...``, no copy."""
        return x.as_strided((z, g, length, x.shape[-1]),
                            (x.stride(0), B * x.stride(1), x.stride(1), 1),
                            x.storage_offset() + first * B * x.stride(1))

    # 1. One kernel call per entry of the plan.
    results = []  # (o (z, p, e), l (z, p)) per call
    parts: list[list[tuple[int, int]]] = [[] for _ in range(n_rows)]  # (call, offset) per block
    for kind, *spec in plan:
        if kind == "shared":  # (z, 1, g*B, d) queries against one (z, 1, T, d) key slice
            rows, s, c = spec
            if rows[-1] - rows[0] + 1 == len(rows):
                qs = q[:, rows[0] * B:min((rows[-1] + 1) * B, i)]
            else:
                pos = (torch.tensor(rows, device=q.device)[:, None] * B
                       + torch.arange(B, device=q.device)).flatten()
                qs = q.index_select(1, pos[pos < i])
            keys = slice(s * B, min((s + c) * B, j))
            o, lse_o = _FLASH_CPU(qs[:, None], k[:, None, keys], v[:, None, keys],
                                  dropout_p=0.0, is_causal=False, attn_mask=None, scale=scale)
            o, lse_o = o[:, 0], lse_o[:, 0]
        else:  # (z, g, B, d) query tiles against (z, g, T, d) key tiles, both strided views
            r0, g, s0, c = spec
            rows = range(r0, r0 + g)
            size = min(B, i - r0 * B)  # only a lone last block can be partial
            t = min((s0 + c) * B, j) - s0 * B
            o, lse_o = _FLASH_CPU(tiles(q, r0, g, size), tiles(k, s0, g, t), tiles(v, s0, g, t),
                                  dropout_p=0.0, is_causal=False, attn_mask=None, scale=scale)
            o, lse_o = o.reshape(z, g * size, e), lse_o.reshape(z, g * size)
        for n, r in enumerate(rows):
            parts[r].append((len(results), n * B))
        results.append((o, lse_o))

    # 2. Merge, a stretch of query blocks fed by the same calls at a time. A first call
    # that covers every query (a global column) already is the output buffer.
    inplace = bool(plan) and plan[0][0] == "shared" and len(plan[0][1]) == n_rows
    out = results[0][0] if inplace else q.new_empty(z, i, e)
    r = 0
    while r < n_rows:
        end = r + 1
        while end < n_rows and len(parts[end]) == len(parts[r]) and all(
            b == (n, p + (end - r) * B) for (n, p), b in zip(parts[r], parts[end], strict=True)
        ):
            end += 1
        length = min(end * B, i) - r * B
        dst = out[:, r * B:r * B + length]  # (z, length, e)
        pieces = [(results[n][0][:, p:p + length], results[n][1][:, p:p + length])
                  for n, p in parts[r]]
        if not pieces:  # rows that attend to nothing are zero, as in the reference
            dst.zero_()
        elif inplace:  # dst holds pieces[0] already
            lse = pieces[0][1]
            for n, (o_n, l_n) in enumerate(pieces[1:], start=2):
                dst.lerp_(o_n, torch.sigmoid(l_n - lse).unsqueeze_(-1))
                if n < len(pieces):
                    lse = torch.logaddexp(lse, l_n)
        elif len(pieces) == 1:
            dst.copy_(pieces[0][0])
        else:
            (o1, l1), (o2, l2) = pieces[:2]
            torch.lerp(o1, o2, torch.sigmoid(l2 - l1).unsqueeze_(-1), out=dst)
            lse = torch.logaddexp(l1, l2) if len(pieces) > 2 else None
            for n, (o_n, l_n) in enumerate(pieces[2:], start=3):
                dst.lerp_(o_n, torch.sigmoid(l_n - lse).unsqueeze_(-1))
                if n < len(pieces):
                    lse = torch.logaddexp(lse, l_n)
        r = end
    return out.reshape(*batch, i, e)


def block_sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    layout: Tensor,
    block_size: int,
    *,
    scale: float | None = None,
) -> Tensor:
    r"""Attention computed only on the kept ``(query block, key block)`` tiles.

    Equal to ``scaled_dot_product_attention(q, k, v, attn_mask=block_sparse_mask(layout,
    B, (i, j)))`` but the work is proportional to the number of kept tiles :math:`P`:
    :math:`P \cdot B^2 (d + e)` instead of :math:`i \cdot j \cdot (d + e)`.

    How, for inference on CPU (float32/64, ``e == d``, no input requiring grad): cut
    every layout row into runs of consecutive kept key blocks. The keys of a run are one
    contiguous slice, so nothing is gathered: query blocks that keep the same run (a
    global column) are stacked against that slice, and query blocks whose run slides
    along with them (a band) are fed as a strided view with one key tile per query block,
    each group in one call of PyTorch's fused attention kernel. The kernel also returns
    each query's log-sum-exp ``l`` of the scores, so a row with several runs merges its
    partial results exactly: with ``L = logaddexp(l_1, l_2)``,
    ``o = exp(l_1 - L) o_1 + exp(l_2 - L) o_2``.

    Otherwise (autograd, other devices or dtypes, or a layout scattered into many short
    runs): group the query blocks by how many key blocks their layout row keeps. For a
    group of ``g`` query blocks that each keep ``m`` key blocks, gather those key/value
    blocks into ``(g, m B, d)`` tiles (``index_select`` of the kept blocks only) and run
    one batched attention: ``(g, B, m B)`` scores, their softmax, the weighted sum. Each
    query block sees all its kept keys in one tile, so its softmax is exact without any
    rescaling. A local + global layout has only a handful of distinct row counts, hence a
    handful of batched calls; large groups are processed a few blocks at a time. The
    lengths need not be multiples of ``B``: the last blocks are zero-padded and the
    padding keys masked.

    Args:
        query: ``(..., i, d)``.
        key: ``(..., j, d)``.
        value: ``(..., j, e)``. Leading dims broadcast.
        layout: ``(ceil(i/B), ceil(j/B))`` boolean, True = this tile may attend (the
            mask convention at block level). The same layout for every batch and head.
        block_size: ``B >= 1``. Smaller blocks follow a pattern more closely but run
            further from the hardware's peak: on a CPU, PyTorch's fused kernel computes a
            score in a 128-row tile at 2.2-2.5 times its cost in one dense call, in a
            256-row tile at about 1.5 times (``benchmarks/sparse.py`` measures this).
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.

    Returns:
        ``(..., i, e)``. A query whose layout row is all False gets a zero output, as in
        the dense reference.

    Example:
        >>> q = k = torch.zeros(1, 4, 2); v = torch.arange(4.0).reshape(1, 4, 1)
        >>> eye = torch.eye(2, dtype=torch.bool)  # each block attends only to itself
        >>> block_sparse_attention(q, k, v, eye, 2).flatten().tolist()
        [0.5, 0.5, 2.5, 2.5]
    """
    query, key, value = _check_qkv(query, key, value, scale, same_length=False)
    B = check_int("block_size", block_size, minimum=1)
    i, j, d, e = query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1]
    _check_layout(layout, B, i, j)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    nbq, nbk = layout.shape
    batch = query.shape[:-2]

    if _use_runs(query, key, value):
        plan = _run_plan(layout, B, i, j)
        if len(plan) <= _MAX_RUN_CALLS_PER_ROW * nbq + 4:
            return _block_sparse_runs(query, key, value, plan, B, nbq, scale)

    q = _pad_positions(query, 0, nbq * B - i).unflatten(-2, (nbq, B))  # (..., c, B, d)
    k = _pad_positions(key, 0, nbk * B - j).unflatten(-2, (nbk, B))  # (..., kb, B, d)
    v = _pad_positions(value, 0, nbk * B - j).unflatten(-2, (nbk, B))  # (..., kb, B, e)

    # Group the query blocks by how many key blocks they keep: inside a group every query
    # block gathers the same number of key tiles, so one batched call covers the group.
    layout = layout.to(query.device)
    counts = layout.sum(dim=-1)  # (c,)
    pieces, order = [], []
    for count in counts.unique().tolist():
        if count == 0:  # rows that attend to nothing stay zero, as in the reference
            continue
        rows = (counts == count).nonzero().flatten()  # (g,)
        cols = layout[rows].nonzero()[:, 1].view(len(rows), count)  # (g, count), sorted
        step = _blocks_per_chunk(batch.numel() * count * B * (B + d + e))
        for g0 in range(0, len(rows), step):
            r, kc = rows[g0:g0 + step], cols[g0:g0 + step]  # (g,), (g, count)
            kt = k.index_select(-3, kc.flatten()).flatten(-3, -2)  # (..., g*count*B, d)
            vt = v.index_select(-3, kc.flatten()).flatten(-3, -2)  # (..., g*count*B, e)
            kt = kt.unflatten(-2, (len(r), count * B))  # (..., g, count*B, d)
            vt = vt.unflatten(-2, (len(r), count * B))  # (..., g, count*B, e)
            mask = None
            if j % B:  # hide the padding keys of the last key block
                key_pos = kc[:, :, None] * B + torch.arange(B, device=query.device)
                mask = (key_pos < j).flatten(-2, -1)[:, None, :]  # (g, 1, count*B)
            pieces.append(_tile_attention(q.index_select(-3, r), kt, vt, mask, scale))
            order.append(r)
    if not pieces:  # an all-False layout: an empty step keeps the output in the graph
        none = torch.zeros(0, dtype=torch.long, device=query.device)
        pieces.append(_tile_attention(q.index_select(-3, none), k.index_select(-3, none),
                                      v.index_select(-3, none), None, scale))
        order.append(none)
    out = q.new_zeros(*batch, nbq, B, e)
    out = out.index_copy(-3, torch.cat(order), torch.cat(pieces, dim=-3))  # (..., c, B, e)
    return out.flatten(-3, -2)[..., :i, :]  # (..., i, e)


def local_global_layout(
    n_blocks: int, window: int, num_global: int, *, is_causal: bool = False, device=None
) -> Tensor:
    """A block layout: a band of ``window`` neighbouring blocks plus ``num_global`` global blocks.

    Block ``(r, c)`` is kept iff ``|r - c| <= window`` or ``r < num_global`` or
    ``c < num_global`` (the Longformer / BigBird shape at block level), and, with
    ``is_causal``, only if ``c <= r``. Feed it to :func:`block_sparse_attention` and
    :func:`~attention.masks.block_sparse_mask`.

    Args:
        n_blocks: blocks per side.
        window: neighbouring blocks on each side, ``>= 0``.
        num_global: leading global blocks, in ``[0, n_blocks]``.

    Returns:
        ``(n_blocks, n_blocks)`` boolean layout, True = the tile is computed.

    Example:
        >>> local_global_layout(4, 0, 1).int().tolist()
        [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    """
    n_blocks = check_int("n_blocks", n_blocks, minimum=0)
    window = check_int("window", window, minimum=0)
    num_global = check_int("num_global", num_global, minimum=0)
    if num_global > n_blocks:
        raise ValueError(f"num_global must be <= n_blocks={n_blocks}, got {num_global}")
    layout = global_tokens_mask(n_blocks, window, range(num_global), device=device)
    if is_causal:
        layout = layout & torch.ones_like(layout).tril()
    return layout
