"""Sparse attention that computes only the kept blocks (taught in chapter 10).

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

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import broadcast_shapes, check_int, check_tensor
from .masks import global_tokens_mask

__all__ = ["sliding_window_attention", "block_sparse_attention", "local_global_layout"]


def _check_qkv(query, key, value, scale, *, same_length: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Boundary checks shared by both kernels; returns q, k, v broadcast over the batch dims."""
    check_tensor("query", query, floating=True, min_dim=2)
    check_tensor("key", key, floating=True, min_dim=2)
    check_tensor("value", value, floating=True, min_dim=2)
    for name, t in (("key", key), ("value", value)):
        if t.dtype != query.dtype:
            raise TypeError(f"query and {name} must share a dtype, got {query.dtype} and {t.dtype}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "query and key must share their last dimension d, "
            f"got {query.shape[-1]} and {key.shape[-1]}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            "key and value must have the same number of positions j, "
            f"got {key.shape[-2]} and {value.shape[-2]}"
        )
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
    """Zero-pad the positions axis (-2) of ``(..., n, d)``."""
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

    How: group the query blocks by how many key blocks their layout row keeps. For a
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
        block_size: ``B >= 1``.
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
