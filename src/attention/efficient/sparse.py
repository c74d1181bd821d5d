"""Sparse attention that computes only the kept blocks (taught in chapter 13).

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads, ``i`` query
positions, ``j`` key positions, ``d`` query/key size, ``e`` value size; ``B`` is a block
size, ``c`` a query block, ``g`` a group of query blocks, ``T`` the keys of one tile.

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``, as
in ``torch.nn.functional.scaled_dot_product_attention``; a float mask is added to the
scores. Each kernel here is exactly the dense reference
:func:`attention.scaled_dot_product_attention` with a pattern from
:mod:`attention.efficient.patterns`
(:func:`~attention.efficient.patterns.sliding_window_mask`,
:func:`~attention.efficient.patterns.block_sparse_mask`) combined with ``attn_mask``,
but never builds the ``(i, j)`` scores: time and memory grow with the number of kept
entries, linearly in ``n`` for a fixed window or a fixed number of kept blocks per row.
A key outside a query's window or layout never affects that query, not even a NaN or an
infinity.

Both take the package's attention contract: ``(query, key, value, *, attn_mask=None,
is_causal=False, scale=None, enable_gqa=False, ...)`` with their own options after
these.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import (
    broadcast_shapes,
    check_same_device,
    check_size,
    validate_attention,
)
from .._core import (
    additive_mask,
    attention_scores,
    default_scale,
    expand_kv_heads,
    masked_softmax,
    matmul_skipping,
    poisoned_rows,
)
from . import _sparse_cpu
from ._patterns import causal_bounds, check_layout, check_layout_fits, window_bounds

__all__ = ["sliding_window_attention", "block_sparse_attention"]

# Each step of a kernel works on as many blocks as keep its temporaries near this many
# numbers: bounded peak memory, yet few and large steps, which a CPU runs fastest.
_CHUNK_ELEMENTS = 1 << 23


def _prepare(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    """The contract's boundary checks; returns q, k, v broadcast to one batch, the mask
    and the scale.

    With ``enable_gqa`` every key/value head is repeated for its group of query heads. A
    float mask is cast to the query's dtype (torch 2.13's fused CPU kernel misreads a
    float32 mask with batch axes next to float64 inputs).
    """
    scores_shape = validate_attention(
        query, key, value, attn_mask, is_causal, scale, enable_gqa
    )
    batch = scores_shape[:-2]  # (..., h)
    if enable_gqa:
        key, value = expand_kv_heads(key, batch[-1]), expand_kv_heads(value, batch[-1])
    query, key, value = (t.expand(*batch, *t.shape[-2:]) for t in (query, key, value))
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(query.dtype)
    return query, key, value, attn_mask, default_scale(scale, query.shape[-1])


def _blocks_per_step(elements_per_block: int, chunk_elements: int) -> int:
    return max(1, chunk_elements // max(1, elements_per_block))


def _pad_positions(x: Tensor, before: int, after: int) -> Tensor:
    """Zero-pad the positions axis (-2) of ``(..., n, d)`` (no copy when there is no
    padding)."""
    if before == 0 and after == 0:
        return x
    return F.pad(x, (0, 0, before, after))


def _trivial_output(query: Tensor, key: Tensor, value: Tensor) -> Tensor | None:
    """The output when there is nothing to compute, else None.

    ``i = 0`` or ``j = 0``: ``(..., i, e)`` zeros, as torch gives, kept in the autograd
    graph. On the meta device: an empty tensor of the output's shape.
    """
    if query.shape[-2] == 0 or key.shape[-2] == 0:
        return query[..., :0].sum(-1, keepdim=True) + value[..., :0, :].sum(
            -2, keepdim=True
        )
    if query.device.type == "meta":  # shapes only
        return query.new_empty(*query.shape[:-1], value.shape[-1])
    return None


def _gather_mask(mask: Tensor, i: int, j: int, rows: Tensor, cols: Tensor) -> Tensor:
    """The entries ``mask[..., rows[g, a], cols[g, t]]`` as ``(..., g, a, t)``, nothing
    more.

    ``mask`` broadcasts to ``(..., i, j)``; only the gathered entries are materialised.
    """
    mask = (
        mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
        if mask.dim() < 2
        else mask
    )
    mask = mask.expand(*mask.shape[:-2], i, j)  # a view: broadcast axes have stride 0
    return mask[..., rows[:, :, None], cols[:, None, :]]


def _fused_tile_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float
) -> Tensor:
    """PyTorch's fused kernel on tiles ``(..., c, B, d)``, ``(..., c, T, d)``,
    ``(..., c, T, e)``.

    It keeps each tile's scores in cache instead of writing them to memory. It wants 4-D
    inputs, so the leading dims are flattened into one. ``mask`` is boolean (True = may
    attend) or float (added), broadcastable to ``(..., c, B, T)``; a row that sees no
    key is zero.
    """
    lead = broadcast_shapes(
        "the tiles' batch dims", q.shape[:-3], k.shape[:-3], v.shape[:-3]
    )
    if mask is not None:
        lead = broadcast_shapes("the tiles' batch dims", lead, mask.shape[:-3])
        mask = mask.expand(*lead, *mask.shape[-3:]).reshape(
            lead.numel(), *mask.shape[-3:]
        )
    q, k, v = (
        t.expand(*lead, *t.shape[-3:]).reshape(lead.numel(), *t.shape[-3:])
        for t in (q, k, v)
    )
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.reshape(*lead, *out.shape[-3:])  # (..., c, B, e)


def _masked_tile_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    hide: Tensor | None,
    bias: Tensor | None,
    scale: float,
    finite_values: bool,
) -> Tensor:
    r"""Attention inside tiles, written out:
    :math:`\operatorname{softmax}(q k^\top s + \text{bias}) v`.

    Args:
        q: ``(..., c, B, d)`` query blocks.
        k: ``(..., c, T, d)`` the keys each block may see (a tile).
        v: ``(..., c, T, e)``.
        hide: boolean, broadcastable to ``(..., c, B, T)``, True = may **not** attend
            (the complement of a mask, so a precomputed band costs no negation per
            step); ``None`` hides nothing.
        bias: float, broadcastable to the scores, added to them; or ``None``.
        finite_values: whether ``v`` is free of NaN and infinities. Otherwise the
            weighted sum skips the hidden keys instead of multiplying them by a zero
            weight (``0 * inf`` is NaN), so they cannot reach the row.

    Returns:
        ``(..., c, B, e)``; a row with no visible key is zero.
    """
    scores, _ = attention_scores(q, k, scale=scale)  # (..., c, B, T)
    if bias is not None:
        scores = scores + bias
    if hide is not None:
        # where, not +(-inf): a hidden NaN score must not survive. In place: the
        # matmul's backward does not need its output.
        scores.masked_fill_(hide, float("-inf"))
    if bias is not None:
        hide = torch.isneginf(scores)  # a float mask can hide keys too
    weights = masked_softmax(scores)  # a row with no visible key gets zero weights
    return matmul_skipping(weights, v, hide, finite_values)  # (..., c, B, e)


def _band_tile_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    band_bias: Tensor,
    outside_band: Tensor,
    scale: float,
    finite_values: bool,
) -> Tensor:
    """:func:`_masked_tile_attention` for tiles that share one band and reach no
    padding.

    The band is added to the scores as a ``(B, T)`` bias of 0 / -inf (a broadcast
    ``masked_fill`` costs many times more). Every query of such a tile sees at least
    itself, so no row is empty; but a non-finite input can leave NaN weights: a hidden
    NaN or +inf score (NaN after the bias), or a row whose visible scores are all -inf
    (an infinite key), which the dense reference gives zero weights. A sum of the
    weights notices it, and only then are the hidden keys set to -inf one by one and
    the softmax taken again, the masked one that zeroes such a row.
    """
    scores, _ = attention_scores(q, k, scale=scale)  # (..., c, B, T)
    scores += band_bias  # in place: the matmul's backward does not need its output
    weights = torch.softmax(scores, dim=-1)  # (..., c, B, T)
    if bool(weights.sum().isnan()):  # rare: a non-finite input, or a visible NaN
        # (in place again: the softmax's backward needs its output, not its input)
        scores.masked_fill_(outside_band, float("-inf"))
        weights = masked_softmax(scores)
    return matmul_skipping(weights, v, outside_band, finite_values)  # (..., c, B, e)


def _poison(out: Tensor, query: Tensor, key: Tensor, scale: float) -> Tensor:
    """NaN in the rows whose score against any key, kept or skipped, is NaN or ``+inf``:
    the rule of the dense reference (``_core.poisoned_rows``)."""
    bad = poisoned_rows(query, key, scale, False)
    return out if bad is None else out.masked_fill(bad, float("nan"))


def _all_finite(*tensors: Tensor) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def sliding_window_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    window,
    block_size: int | None = None,
) -> Tensor:
    r"""Local attention in :math:`O(n \cdot w)` time and memory, equal to dense
    attention + band mask.

    Query :math:`p` attends to the keys :math:`k` with :math:`p - \text{left} \le k \le
    p + \text{right}`, exactly as ``scaled_dot_product_attention(q, k, v,
    attn_mask=sliding_window_mask(i, window, j=j, is_causal=is_causal) & attn_mask)``.

    Window conventions: ``window=w`` is :math:`|p - k| \le w` (``w`` keys on each side);
    ``window=(left, right)`` is flash-attn's ``window_size=(left, right)``, with
    ``None`` where flash-attn writes ``-1`` (unbounded). Hugging Face's
    ``sliding_window=w`` counts the query itself: its causal window is
    ``window=(w - 1, 0)`` here. With ``i != j`` the queries are the last ``i`` of the
    ``j`` positions (bottom-right, as in decoding with a cache, and as flash-attn aligns
    them): query ``a`` sits at ``p = a + j - i``.

    How: the queries are cut into blocks of ``B`` positions. Block ``c`` can only see
    the ``T = left + B + right`` keys from ``cB + j - i - left`` on, so those are one
    strided ``unfold`` view of the zero-padded keys (no copy of the ``(i, j)`` matrix);
    the ``(B, T)`` scores of many blocks are computed with one batched matmul, and a
    band mask (the same for every block) hides what the dense mask hides. The work is
    :math:`i \cdot T \cdot (d + e)`: linear in ``n``. Sizes beyond the sequence are
    clamped (a window of ``10**9`` is the whole sequence, not a huge tile).

    Args:
        query, key, value: ``(..., h, i, d)``, ``(..., h_kv, j, d)``,
            ``(..., h_kv, j, e)``; leading dims broadcast.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``; combined with the window. Not together
            with ``is_causal``.
        is_causal: also hide the keys after each query (``right = 0``); needs ``i == j``
            (for ``i != j`` pass ``window=(left, 0)``: torch's ``is_causal`` aligns
            top-left).
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.
        window: ``w >= 0`` or ``(left, right)``, each ``>= 0`` or ``None``.
        block_size: query block ``B >= 1``; default ``min(i, max(left, right, 32))``.
            Any ``B`` gives the same result; ``B`` close to the window wastes least
            work.

    Returns:
        ``(..., h, i, e)``. A query that sees no key (possible with ``attn_mask`` or
        ``i > j``) gets a zero output. A query whose score against any key, even one
        outside its window, is NaN or ``+inf`` gets NaN, as in the dense reference.

    Example:
        >>> q = k = torch.zeros(1, 4, 2); v = torch.arange(4.0).reshape(1, 4, 1)
        >>> # neighbour means
        >>> sliding_window_attention(q, k, v, window=1).flatten().tolist()
        [0.5, 1.0, 2.0, 2.5]
        >>> # causal
        >>> sliding_window_attention(q, k, v, window=(1, 0)).flatten().tolist()
        [0.0, 0.5, 1.5, 2.5]
    """
    query, key, value, attn_mask, scale = _prepare(
        query, key, value, attn_mask, is_causal, scale, enable_gqa
    )
    i, j = query.shape[-2], key.shape[-2]
    left, right = window_bounds(window, i, j)
    left, right = causal_bounds(left, right, is_causal, i, j)
    if block_size is not None:
        block_size = check_size("block_size", block_size)
    trivial = _trivial_output(query, key, value)
    if trivial is not None:
        return trivial
    # Bounds past the first or last key reach nothing more: clamp them (same result).
    left, right = min(left, j - 1), min(right, i - 1)
    B = min(i, block_size if block_size is not None else max(left, right, 32))
    out = _sliding_window(query, key, value, attn_mask, scale, left, right, B)
    return _poison(out, query, key, scale)


def _sliding_window(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    scale: float,
    left: int,
    right: int,
    B: int,
    *,
    chunk_elements: int = _CHUNK_ELEMENTS,
) -> Tensor:
    """The unchecked core of :func:`sliding_window_attention` (batch dims already
    broadcast)."""
    i, j, d, e = query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1]
    nb = -(-i // B)  # number of query blocks
    T = left + B + right  # keys per tile
    first = (
        j - i - left
    )  # key position of tile 0's first key; tile c starts at c*B + first
    span = (nb - 1) * B + T  # key positions covered by all tiles together
    before, after = max(0, -first), max(0, first + span - j)

    q = _pad_positions(query, 0, nb * B - i).unflatten(-2, (nb, B))  # (..., c, B, d)
    # Tile c holds keys c*B + first ... c*B + first + T - 1: a strided view, no copy
    # yet.
    k = _pad_positions(key, before, after)[
        ..., first + before : first + before + span, :
    ]
    v = _pad_positions(value, before, after)[
        ..., first + before : first + before + span, :
    ]
    k = k.unfold(-2, T, B).transpose(-1, -2)  # (..., c, T, d)
    v = v.unfold(-2, T, B).transpose(-1, -2)  # (..., c, T, e)

    # Query a of block c is position c*B + a + j - i and key t of its tile is
    # c*B + first + t, so "query minus key" is a + left - t in every block: one (B, T)
    # band.
    a = torch.arange(B, device=query.device)
    t = torch.arange(T, device=query.device)
    offset = a[:, None] + left - t[None, :]  # (B, T)
    outside_band = (offset > left) | (offset < -right)  # (B, T)
    key_pos = torch.arange(nb, device=query.device)[:, None] * B + first + t  # (c, T)
    padding = (key_pos < 0) | (key_pos >= j)  # (c, T): the zero padding
    query_pos = torch.arange(nb, device=query.device)[:, None] * B + a  # (c, B), from 0

    finite = _all_finite(value)
    per_block = query.shape[:-2].numel() * B * (T + d + e + (0 if finite else T * e))
    step = _blocks_per_step(per_block, chunk_elements)
    # Only the tiles at the two ends reach into the zero padding (and hold the queries
    # that may see no key): they go one at a time through the general path. The tiles
    # between share one band, added to their scores as 0 / -inf.
    edges = (
        set(padding.any(dim=-1).nonzero().flatten().tolist()) if mask is None else set()
    )
    band_bias = additive_mask(~outside_band, query.dtype)  # (B, T): 0 or -inf
    outs, c0 = [], 0
    while c0 < nb:
        c1 = c0 + 1
        if c0 not in edges:  # a run of tiles between the ends, or any tiles with a mask
            while c1 < min(nb, c0 + step) and c1 not in edges:
                c1 += 1
        blocks = slice(c0, c1)
        qc, kc, vc = q[..., blocks, :, :], k[..., blocks, :, :], v[..., blocks, :, :]
        if mask is None and c0 not in edges:
            outs.append(
                _band_tile_attention(qc, kc, vc, band_bias, outside_band, scale, finite)
            )
        else:
            hide, bias = outside_band | padding[blocks, None, :], None  # (c, B, T)
            if mask is not None:
                tile = _gather_mask(
                    mask,
                    i,
                    j,
                    query_pos[blocks].clamp(max=i - 1),
                    key_pos[blocks].clamp(0, j - 1),
                )  # (..., c, B, T)
                hide, bias = (
                    (hide | ~tile, None) if tile.dtype == torch.bool else (hide, tile)
                )
            outs.append(_masked_tile_attention(qc, kc, vc, hide, bias, scale, finite))
        c0 = c1
    out = torch.cat(outs, dim=-3)  # (..., c, B, e)
    return out.flatten(-3, -2)[..., :i, :]  # (..., i, e)


def block_sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    layout: Tensor,
    block_size: int,
) -> Tensor:
    r"""Attention computed only on the kept ``(query block, key block)`` tiles.

    Equal to ``scaled_dot_product_attention(q, k, v, attn_mask=block_sparse_mask(layout,
    B, (i, j)) & attn_mask)`` (and the causal mask with ``is_causal``), but the work is
    proportional to the number of kept tiles :math:`P`: :math:`P \cdot B^2 (d + e)`
    instead of :math:`i \cdot j \cdot (d + e)`. A key in a block the layout drops never
    affects the query, whatever its value.

    How: group the query blocks by how many key blocks their layout row keeps. For a
    group of ``g`` query blocks that each keep ``m`` key blocks, gather those key/value
    blocks into ``(g, m B, d)`` tiles (``index_select`` of the kept blocks only) and run
    one batched attention: ``(g, B, m B)`` scores, their softmax, the weighted sum. Each
    query block sees all its kept keys in one tile, so its softmax is exact without any
    rescaling. A local + global layout has only a handful of distinct row counts, hence
    a handful of batched calls; large groups are processed a few blocks at a time. The
    lengths need not be multiples of ``B``: the last blocks are zero-padded and the
    padding keys masked.

    For inference on a CPU (float32/64, ``e == d``, no input requiring grad, no
    ``attn_mask``, not causal) a faster path that reads whole runs of kept blocks
    without gathering them gives the same result; it lives in the private module
    ``attention.efficient._sparse_cpu``.

    Args:
        query, key, value: ``(..., h, i, d)``, ``(..., h_kv, j, d)`` and
            ``(..., h_kv, j, e)``, leading dims broadcasting.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``; combined with the layout. Not together
            with ``is_causal``.
        is_causal: also hide the keys after each query, top-left aligned as in
            ``torch.nn.functional.scaled_dot_product_attention`` (query ``a`` sees keys
            ``<= a``).
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.
        layout: ``(ceil(i/B), ceil(j/B))`` boolean on the inputs' device, True = this
            tile may attend (the mask convention at block level); the same for every
            batch and head.
        block_size: ``B >= 1``. Smaller blocks follow a pattern more closely but run
            further from the hardware's peak: on a CPU, PyTorch's fused kernel computes
            a score in a 128-row tile at 2.2-2.5 times its cost in one dense call, in a
            256-row tile at about 1.5 times (``benchmarks/sparse.py`` measures this).

    Returns:
        ``(..., h, i, e)``. A query that sees no key gets a zero output, and one whose
        score against any key (computed or skipped) is NaN or ``+inf`` gets NaN, as in
        the dense reference.

    Example:
        >>> q = k = torch.zeros(1, 4, 2); v = torch.arange(4.0).reshape(1, 4, 1)
        >>> eye = torch.eye(2, dtype=torch.bool)  # each block attends only to itself
        >>> block_sparse_attention(q, k, v, layout=eye, block_size=2).flatten().tolist()
        [0.5, 0.5, 2.5, 2.5]
    """
    query, key, value, attn_mask, scale = _prepare(
        query, key, value, attn_mask, is_causal, scale, enable_gqa
    )
    check_layout(layout)
    B = check_size("block_size", block_size)
    i, j = query.shape[-2], key.shape[-2]
    check_layout_fits(layout, B, i, j)
    check_same_device(query=query, layout=layout)
    trivial = _trivial_output(query, key, value)
    if trivial is not None:
        return trivial
    B = min(B, max(i, j))  # one block either way: the same partition, no huge padding
    if attn_mask is None and not is_causal:
        out = _sparse_cpu.block_sparse_runs(query, key, value, layout, B, scale)
        if out is not None:
            return _poison(out, query, key, scale)
    out = _block_sparse_gather(
        query, key, value, attn_mask, is_causal, scale, layout, B
    )
    return _poison(out, query, key, scale)


def _block_sparse_gather(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    is_causal: bool,
    scale: float,
    layout: Tensor,
    B: int,
    *,
    chunk_elements: int = _CHUNK_ELEMENTS,
) -> Tensor:
    """The readable path of :func:`block_sparse_attention` (inputs checked, batch
    broadcast)."""
    i, j, d, e = query.shape[-2], key.shape[-2], query.shape[-1], value.shape[-1]
    batch = query.shape[:-2]
    nbq, nbk = layout.shape
    # A lone block is as long as the sequence: queries (keys) are padded only up to the
    # next multiple of B when there are several blocks, i.e. by less than i (j).
    Bq, Bk = (B if nbq > 1 else i), (B if nbk > 1 else j)
    q = _pad_positions(query, 0, nbq * Bq - i).unflatten(
        -2, (nbq, Bq)
    )  # (..., c, B, d)
    k = _pad_positions(key, 0, nbk * Bk - j).unflatten(-2, (nbk, Bk))  # (..., kb, B, d)
    v = _pad_positions(value, 0, nbk * Bk - j).unflatten(
        -2, (nbk, Bk)
    )  # (..., kb, B, e)
    hides = mask is not None or is_causal or j % Bk != 0  # some kept keys are hidden
    finite = not hides or _all_finite(key, value)

    # Group the query blocks by how many key blocks they keep: inside a group every
    # query block gathers the same number of key tiles, so one batched call covers the
    # group.
    counts = layout.sum(dim=-1)  # (c,)
    pieces, order = [], []
    for count in counts.unique().tolist():
        if count == 0:  # rows that attend to nothing stay zero, as in the reference
            continue
        rows = (counts == count).nonzero().flatten()  # (g,)
        cols = layout[rows].nonzero()[:, 1].view(len(rows), count)  # (g, count), sorted
        per_block = (
            batch.numel() * count * Bk * (Bq + d + e + (0 if finite else Bq * e))
        )
        step = _blocks_per_step(per_block, chunk_elements)
        for g0 in range(0, len(rows), step):
            r, kc = rows[g0 : g0 + step], cols[g0 : g0 + step]  # (g,), (g, count)
            kt = k.index_select(-3, kc.flatten()).flatten(-3, -2)  # (..., g*count*B, d)
            vt = v.index_select(-3, kc.flatten()).flatten(-3, -2)  # (..., g*count*B, e)
            kt = kt.unflatten(-2, (len(r), count * Bk))  # (..., g, T, d)
            vt = vt.unflatten(-2, (len(r), count * Bk))  # (..., g, T, e)
            qt = q.index_select(-3, r)  # (..., g, B, d)
            hide = bias = None
            if hides:
                query_pos = r[:, None] * Bq + torch.arange(
                    Bq, device=r.device
                )  # (g, B)
                key_pos = (
                    kc[:, :, None] * Bk + torch.arange(Bk, device=r.device)
                ).flatten(1)
                hide = (key_pos >= j)[:, None, :]  # (g, 1, T): the padding
                if is_causal:
                    hide = hide | (
                        key_pos[:, None, :] > query_pos[:, :, None]
                    )  # (g, B, T)
                if mask is not None:
                    tile = _gather_mask(
                        mask, i, j, query_pos.clamp(max=i - 1), key_pos.clamp(max=j - 1)
                    )  # (..., g, B, T)
                    hide, bias = (
                        (hide | ~tile, None)
                        if tile.dtype == torch.bool
                        else (hide, tile)
                    )
            if finite:
                fused_mask = None if hide is None else ~hide
                if bias is not None and hide is not None:  # a bias comes with hide
                    fused_mask = bias.masked_fill(hide, float("-inf"))
                pieces.append(_fused_tile_attention(qt, kt, vt, fused_mask, scale))
            else:
                pieces.append(
                    _masked_tile_attention(qt, kt, vt, hide, bias, scale, False)
                )
            order.append(r)
    if not pieces:  # an all-False layout: an empty step keeps the output in the graph
        none = torch.zeros(0, dtype=torch.long, device=query.device)
        pieces.append(
            _fused_tile_attention(
                q.index_select(-3, none),
                k.index_select(-3, none),
                v.index_select(-3, none),
                None,
                scale,
            )
        )
        order.append(none)
    out = q.new_zeros(*batch, nbq, Bq, e)
    out = out.index_copy(
        -3, torch.cat(order), torch.cat(pieces, dim=-3)
    )  # (..., c, B, e)
    return out.flatten(-3, -2)[..., :i, :]  # (..., i, e)
