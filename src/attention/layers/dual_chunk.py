"""Dual Chunk Attention: RoPE attention past the pretraining length, with no unseen
distance (chapter 7).

A model trained with rotary embeddings on sequences of length ``L`` has only seen
query-key distances below ``L``. Dual Chunk Attention (DCA; An et al., 2024, used by
Qwen2.5-1M) splits the sequence into chunks of ``s`` positions and gives each key the
position ``p mod s``. A query uses one of three positions, depending on where the key
is:

* **intra-chunk** (key in the query's own chunk): ``p mod s``, so the distance is the
  true one, ``q - k``;
* **successive-chunk** (key in the chunk just before): ``min(s + p mod s, s + w)``, the
  true distance for the first ``w + 1`` queries of a chunk (the local window ``w``),
  then capped;
* **inter-chunk** (key two or more chunks back): ``s + w``, the same for every query.

Every distance then lies in ``[0, s + w]``: with ``s + w < L`` the model never meets a
distance it was not trained on, and up to ``s + w + 1`` tokens DCA is plain RoPE
attention. Far keys lose their exact distance (they all look about ``s + w - (k mod s)``
away), the price of the trick.

Shape legend: ``b`` batch (any number of leading dims ``...``), ``h`` query heads,
``h_kv`` key/value heads, ``i`` query positions, ``j`` key positions, ``d`` query/key
size (even), ``e`` value size.

Mask convention: boolean, **True = may attend**, broadcastable to ``(..., h, i, j)``, as
in ``torch.nn.functional.scaled_dot_product_attention``; a float mask is added to the
scores. DCA is causal by construction; a mask is applied on top of the causal pattern.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._checks import check_bool, check_int, check_size, validate_attention
from .._core import (
    attention_scores,
    default_scale,
    expand_kv_heads,
    masked_softmax,
    poisoned_rows,
    tril_mask,
)
from .._rope import check_scaling, rope_config, rope_rotate
from .positional import RotaryConfig

__all__ = ["dual_chunk_positions", "dual_chunk_attention"]


class DualChunkPositions(NamedTuple):
    """The position indices of DCA for ``n`` tokens, each ``(n,)`` int64."""

    key: Tensor  # p mod s
    intra: Tensor  # p mod s
    successive: Tensor  # min(s + p mod s, s + w)
    inter: Tensor  # s + w


def _check_chunking(chunk_size, local_window) -> tuple[int, int]:
    s = check_size("chunk_size", chunk_size)
    w = check_int("local_window", local_window, minimum=0)
    if w >= s:
        raise ValueError(
            f"local_window must be smaller than chunk_size, got local_window={w} and "
            f"chunk_size={s}"
        )
    return s, w


def _positions(p: Tensor, s: int, w: int) -> DualChunkPositions:
    within = p % s
    return DualChunkPositions(
        key=within,
        intra=within,
        successive=(within + s).clamp(max=s + w),
        inter=torch.full_like(p, s + w),
    )


def dual_chunk_positions(
    n: int, *, chunk_size: int, local_window: int = 0
) -> DualChunkPositions:
    """The position indices DCA gives to ``n`` tokens (see the module docstring).

    Args:
        n: number of tokens, positions ``0 ... n - 1``.
        chunk_size: ``s``, positions per chunk.
        local_window: ``w``, ``0 <= w < s``: the first ``w + 1`` queries of a chunk keep
            their true distance to the previous chunk.

    Returns:
        ``DualChunkPositions(key, intra, successive, inter)``, each ``(n,)`` int64: the
        position of every token as a key, and as a query towards keys in its own chunk,
        in the previous chunk, and further back. None exceeds ``s + w``.

    Example:
        >>> pos = dual_chunk_positions(8, chunk_size=3, local_window=1)
        >>> pos.key.tolist(), pos.successive.tolist(), pos.inter.tolist()
        ([0, 1, 2, 0, 1, 2, 0, 1], [3, 4, 4, 3, 4, 4, 3, 4], [4, 4, 4, 4, 4, 4, 4, 4])
    """
    n = check_int("n", n, minimum=0)
    s, w = _check_chunking(chunk_size, local_window)
    return _positions(torch.arange(n), s, w)


def dual_chunk_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = True,
    scale: float | None = None,
    enable_gqa: bool = False,
    chunk_size: int,
    local_window: int = 0,
    rope: RotaryConfig | None = None,
) -> Tensor:
    r"""Causal rotary attention with Dual Chunk Attention's position indices.

    For a query at position ``q`` and a key at ``k`` (chunks ``c_q = q // s`` and
    ``c_k = k // s``) the score is

    .. math::
        \frac{\langle R_{\pi(q, k)}\, q_q,\; R_{k \bmod s}\, k_k \rangle}{\sqrt d},
        \qquad \pi(q, k) = \begin{cases} q \bmod s & c_k = c_q \\
        \min(s + q \bmod s,\; s + w) & c_k = c_q - 1 \\
        s + w & c_k < c_q - 1 \end{cases}

    with :math:`R_p` the rotation of :func:`attention.apply_rope`; keys after the query
    are masked. The computation runs one query chunk at a time, so it holds ``(s, j)``
    scores rather than ``(i, j)``.

    Args:
        query: ``(..., h, i, d)`` queries *before* RoPE (this function rotates them).
        key: ``(..., h_kv, j, d)`` keys before RoPE.
        value: ``(..., h_kv, j, e)``.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``; applied on top of the causal pattern.
        is_causal: must be True: the chunk relation needs the key not to follow the
            query. (The default differs from SDPA's for that reason.)
        scale: multiplies the scores; default :math:`1/\sqrt d`.
        enable_gqa: ``h`` a multiple of ``h_kv`` (grouped-query attention).
        chunk_size: ``s``. With the model's pretraining length ``L``, choose
            ``s + w < L`` (Qwen's configs name ``s + w`` "chunk_size" and ``w``
            "local_size").
        local_window: ``w``, ``0 <= w < s``.
        rope: the rotary embedding's options, a :class:`attention.RotaryConfig` (default
            ``RotaryConfig()``).

    Returns:
        ``(..., h, i, e)``. The ``i`` queries are the last ``i`` of the ``j`` positions
        (``i = j`` for a whole sequence, ``i = 1`` when decoding). For
        ``j <= s + w + 1`` the result equals plain causal RoPE attention.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> kw = dict(generator=g, dtype=torch.float64)
        >>> q, k, v = (torch.randn(1, 2, 6, 4, **kw) for _ in range(3))
        >>> out = dual_chunk_attention(q, k, v, chunk_size=4, local_window=1)
        >>> from attention import apply_rope, scaled_dot_product_attention
        >>> q_rot, k_rot = apply_rope(q), apply_rope(k)
        >>> plain = scaled_dot_product_attention(q_rot, k_rot, v, is_causal=True)
        >>> torch.allclose(out, plain)  # 6 <= s + w + 1 tokens: plain RoPE attention
        True
    """
    scores_shape = validate_attention(
        query, key, value, attn_mask, False, scale, enable_gqa
    )
    check_bool("is_causal", is_causal)
    if not is_causal:
        raise ValueError(
            "dual_chunk_attention is causal by construction "
            "(a key's chunk must not follow the query's), so is_causal must be True"
        )
    s, w = _check_chunking(chunk_size, local_window)
    rope = rope_config(rope, default=RotaryConfig())
    d = query.shape[-1]
    if d % 2:
        raise ValueError(f"the query/key size d must be even for RoPE, got {d}")
    base, interleaved, scaling = (
        rope.base,
        rope.interleaved,
        check_scaling(rope.scaling, d),
    )
    i, j = query.shape[-2], key.shape[-2]
    if i > j:
        raise ValueError(
            "the i queries are the last i of the j key positions, "
            f"so i <= j is needed, got i={i} and j={j}"
        )

    device = query.device

    def rotate(x: Tensor, positions: Tensor) -> Tensor:
        return rope_rotate(x, positions, base, interleaved, scaling)

    first = j - i  # the queries sit at positions first ... j - 1
    q_pos = torch.arange(first, j, device=device)
    q_idx = _positions(q_pos, s, w)
    k_rot = rotate(
        key, _positions(torch.arange(j, device=device), s, w).key
    )  # (..., h_kv, j, d)
    if enable_gqa:
        k_rot, value = (
            expand_kv_heads(k_rot, query.shape[-3]),
            expand_kv_heads(value, query.shape[-3]),
        )
    q_intra = rotate(query, q_idx.intra)  # (..., h, i, d)
    q_succ = rotate(query, q_idx.successive)
    q_inter = rotate(query, q_idx.inter)
    if attn_mask is not None:
        attn_mask = attn_mask.expand(scores_shape)  # (..., h, i, j), a view

    outputs = [
        query.new_zeros((*scores_shape[:-2], 0, value.shape[-1]))
    ]  # (..., h, 0, e)
    rows_done = 0
    while rows_done < i:  # one chunk of queries at a time
        chunk = (first + rows_done) // s
        stop = min(
            i, (chunk + 1) * s - first
        )  # the rows of this chunk: rows_done ... stop - 1
        rows = slice(rows_done, stop)
        start_succ, start_intra = max(0, (chunk - 1) * s), chunk * s
        end = first + stop  # keys after the chunk's last query are hidden anyway
        parts = (
            (q_inter, 0, start_succ),
            (q_succ, start_succ, start_intra),
            (q_intra, start_intra, end),
        )
        scores = torch.cat(
            [
                attention_scores(qr[..., rows, :], k_rot[..., a:b, :], scale=scale)[0]
                for qr, a, b in parts
            ],
            dim=-1,
        )  # (..., h, rows, end)
        visible = tril_mask(
            stop - rows_done, end, offset=first + rows_done, device=device
        )  # (rows, end): keys up to each query's position
        scores = scores.masked_fill(~visible, float("-inf"))
        mask = None if attn_mask is None else attn_mask[..., rows, :end]
        weights = masked_softmax(scores, mask)  # a row with no visible key: zeros
        outputs.append(weights @ value[..., :end, :])  # (..., h, rows, e)
        rows_done = stop
    out = torch.cat(outputs, dim=-2)  # (..., h, i, e)
    # the package's rule for non-finite scores: a NaN or +inf score against any key,
    # even a future one this loop never computes, makes the row NaN (as in the dense
    # reference)
    bad = poisoned_rows(q_intra, k_rot, default_scale(scale, d), False)
    return out if bad is None else out.masked_fill(bad, float("nan"))
