r"""Exact attention in memory linear in the sequence: online softmax, tiled attention.

Chapter 14 builds the forward pass, chapter 15 the backward.

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads (``h_kv``
key/value heads), ``i`` query positions, ``j`` key positions, ``d`` query/key size,
``e`` value size, ``n`` any softmax axis.

The online softmax :cite:`milakov2018online` keeps a running maximum ``m`` and a
running sum ``l`` of :math:`e^{x - m}`; when a new element (or block) raises the
maximum, the old sum is rescaled:

.. math::

    m_\text{new} = \max(m, x), \qquad
    l_\text{new} = l\, e^{m - m_\text{new}} + e^{x - m_\text{new}}.

Attention applies the same recurrence to a running output as well, one key/value
block at a time :cite:`rabe2021self,dao2022flashattention`, so the ``(i, j)`` score
matrix is never built: only ``(i, block)`` tiles are (chapter 14). The backward pass
recomputes the tiles from the saved per-row log-sum-exp instead of storing them, as
FlashAttention-2 does :cite:`dao2023flashattention2`, so training memory is linear in
the sequence too (chapter 15).

Mask convention: boolean, **True = may attend**, broadcastable to ``(..., i, j)``, as in
``torch.nn.functional.scaled_dot_product_attention``; a float mask is *added* to the
scores. ``is_causal`` is top-left (query ``q`` sees keys ``k <= q``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._checks import (
    check_bool,
    check_dim,
    check_int,
    check_size,
    check_sizes,
    check_tensor,
    validate_attention,
)
from .._core import default_scale, max_shift, poisoned_rows
from ._tiled import TiledAttention

# The facade re-exports the library names (the first 2); the teaching helper after
# them is imported from this module's path by chapter 16 and its exercises.
__all__ = ["online_softmax", "tiled_attention", "flash_tile_kinds"]

#: The kinds of tile in :func:`flash_tile_kinds`' table.
SKIPPED, UNMASKED, MASKED = 0, 1, 2


def online_softmax(x: Tensor, dim: int = -1, *, block_size: int = 1) -> Tensor:
    r"""Softmax along ``dim`` with the one-pass online normaliser.

    The normaliser is Milakov and Gimelshein's :cite:`milakov2018online`.

    One pass over the row computes the maximum and the normaliser together, element by
    element (``block_size=1``) or a block at a time:

    .. math::

        m_k = \max(m_{k-1}, x_k), \qquad
        l_k = l_{k-1}\, e^{m_{k-1} - m_k} + e^{x_k - m_k},

    starting from :math:`m_0 = -\infty, l_0 = 0`. Then
    :math:`\operatorname{softmax}(x)_k = e^{x_k - m} / l`. The first two passes of
    :func:`~attention.foundations.softmax.three_pass_softmax` (the maximum, then the
    sum) become one; the loop is explicit so the recurrence is visible.

    Args:
        x: scores of any shape ``(..., n, ...)``.
        dim: the axis to normalise over.
        block_size: elements read per step of the recurrence (``>= 1``; a block larger
            than the axis reads it whole).

    Returns:
        A tensor of the shape of ``x``, equal to
        :func:`~attention.foundations.softmax` (a row that is entirely ``-inf`` gives
        NaN, as there; a NaN or ``+inf`` makes its row NaN, as in ``torch.softmax``).

    Example:
        >>> x = torch.tensor([1.0, 3.0, 2.0])
        >>> torch.allclose(online_softmax(x), torch.softmax(x, -1))
        True
    """
    check_tensor("x", x, floating=True, min_dim=1)
    block_size = check_int("block_size", block_size, minimum=1)
    dim = check_dim("dim", dim, x.dim())
    x_last = x.movedim(dim, -1)  # (..., n)
    n = x_last.shape[-1]
    m = torch.full(x_last.shape[:-1] + (1,), -math.inf, dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)  # noqa: E741 (the paper's name)
    for start in range(0, n, block_size):
        block = x_last[..., start : start + block_size]  # (..., block)
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        shift = max_shift(m_new)
        rescaled_old = l * torch.exp(m - shift)  # the old sum, moved to the new max
        l = rescaled_old + torch.exp(block - shift).sum(dim=-1, keepdim=True)  # noqa: E741
        m = m_new
    out = torch.exp(x_last - max_shift(m)) / l  # (..., n)
    return out.movedim(-1, dim)


# ---------------------------------------------------------------------- public function


def _validate(
    query, key, value, attn_mask, is_causal, scale, enable_gqa, block_size, return_lse
):
    validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    check_bool("return_lse", return_lse)
    check_size("block_size", block_size, minimum=1)


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    block_size: int = 128,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Exact softmax attention, one key/value block at a time.

    This is the FlashAttention recurrence.

    **Forward.** For each block of ``block_size`` keys, with scores
    :math:`S = Q K_\text{blk}^\top s` (an ``(i, block)`` tile), the running row max
    ``m``, row sum ``l`` and unnormalised output ``acc`` are updated
    :cite:`milakov2018online,rabe2021self,dao2022flashattention`:

    .. math::

        m' = \max(m, \operatorname{rowmax} S), \quad
        l' = l\, e^{m - m'} + \operatorname{rowsum} e^{S - m'}, \quad
        \text{acc}' = \text{acc}\, e^{m - m'} + e^{S - m'} V_\text{blk},

    and at the end :math:`O = \text{acc} / l` and :math:`\text{lse} = m + \log l`. The
    ``(i, j)`` matrix is never built. With ``is_causal`` a key block starting at ``j0``
    only meets the queries ``q >= j0``, which skips the upper triangle.

    **Backward** (FlashAttention-2 :cite:`dao2023flashattention2`). Only q, k, v, the
    output and the log-sum-exp are saved (and the mask, when one is given). Each tile's
    weights are rebuilt as :math:`P = e^{S - \text{lse}}`, and with
    :math:`D = \operatorname{rowsum}(dO \circ O)`:

    .. math::

        dV \mathrel{+}= P^\top dO, \quad dP = dO\, V_\text{blk}^\top, \quad
        dS = P \circ (dP - D), \quad dQ \mathrel{+}= dS\, K_\text{blk}\, s, \quad
        dK_\text{blk} = dS^\top Q\, s.

    A gradient flowing into the returned log-sum-exp adds :math:`P \circ d\text{lse}` to
    :math:`dS`. So memory is :math:`O(i \cdot \text{block} + (i + j)(d + e))` in both
    passes instead of :math:`O(i \cdot j)`. The backward is not itself differentiable
    (no second derivatives).

    Args:
        query: ``(..., h, i, d)`` (any leading dims, at least ``(i, d)``).
        key: ``(..., h_kv, j, d)``.
        value: ``(..., h_kv, j, e)``.
        attn_mask: optional boolean (**True = may attend**) or float (added to the
            scores) mask broadcastable to ``(..., h, i, j)``; sliced per block, never
            expanded. A float mask receives no gradient.
        is_causal: top-left causal mask (query ``q`` sees keys ``k <= q``); not together
            with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``; key/value
            head ``g`` serves query heads ``g*r ... g*r + r - 1`` with ``r = h / h_kv``
            (no copy of the keys is made).
        block_size: keys per block (``>= 1``; a block larger than ``j`` is clamped to
            it).
        return_lse: also return the log-sum-exp of each row's scaled, masked scores.

    Returns:
        ``(..., h, i, e)``, equal to
        ``torch.nn.functional.scaled_dot_product_attention``: a query with no visible
        key (or ``j = 0``) gets a zero output and a zero gradient; NaN in a visible
        input, in a float mask or in ``scale`` propagates as in torch, and so does a NaN
        or ``+inf`` score against a masked (or causally hidden) key: its row is NaN, as
        in torch and :func:`~attention.scaled_dot_product_attention`.
        With ``return_lse`` always the pair ``(output, lse)``, ``lse`` of shape
        ``(..., h, i)`` (``-inf`` for a query with no visible key), differentiable too.

    Example:
        >>> q, k, v = torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 3)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        >>> torch.allclose(tiled_attention(q, k, v, block_size=3), ref, atol=1e-6)
        True
    """
    _validate(
        query,
        key,
        value,
        attn_mask,
        is_causal,
        scale,
        enable_gqa,
        block_size,
        return_lse,
    )
    d, j = query.shape[-1], key.shape[-2]
    scale = default_scale(scale, d)
    block_size = min(block_size, max(j, 1))
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.to(
            query.dtype
        )  # a float32 mask on float64 scores, as torch allows
    q, k, v, mask = query, key, value, attn_mask
    if (
        mask is not None and mask.dim() < 2
    ):  # a (j,) or scalar mask: give it an (i, j) view
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
    if enable_gqa:  # (..., h, i, d) -> (..., h_kv, r, i, d); keys get a size-1 axis r
        q = query.unflatten(-3, (key.shape[-3], query.shape[-3] // key.shape[-3]))
        k, v = key.unsqueeze(-3), value.unsqueeze(-3)
        if mask is not None and mask.dim() >= 3:
            mask = (
                mask.unflatten(-3, q.shape[-4:-2])
                if mask.shape[-3] > 1
                else mask.unsqueeze(-3)
            )
    # the recurrence above, forward and backward: attention.efficient._tiled
    out, lse = TiledAttention.apply(q, k, v, mask, is_causal, scale, block_size)
    if enable_gqa:
        out, lse = out.flatten(-4, -3), lse.flatten(-3, -2)  # back to (..., h, i, *)
    bad = poisoned_rows(
        query, key, scale, enable_gqa
    )  # a skipped or masked +inf/NaN score
    if bad is not None:
        out, lse = (
            out.masked_fill(bad, float("nan")),
            lse.masked_fill(bad.squeeze(-1), float("nan")),
        )
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------- schedule


def flash_tile_kinds(
    num_queries: int, num_keys: int, block_size: int, *, is_causal: bool = False
) -> Tensor:
    r"""Which tiles the FlashAttention-2 forward kernel visits, and which it masks.

    The kernel (:func:`attention.efficient.triton_flash.flash_forward_kernel`, chapter
    16) runs one program per block of ``block_size`` queries; each program folds in the
    key blocks one at a time. Without a causal mask it visits every key block, unmasked.
    With ``is_causal`` (top-left: query ``q`` sees keys ``k <= q``) the program of
    query block ``m`` (rows ``mB .. mB + B - 1``) first visits the key blocks before
    row ``mB``, which every one of its queries sees whole, with no mask; then the
    diagonal block, with the mask; the blocks after it hold only future keys and are
    never loaded. In the kernel's loop bounds, with :math:`B` the block size:

    .. math::

        \text{unmasked: } k_0 < \min(mB, j), \qquad
        \text{masked: } \min(mB, j) \le k_0 < \min((m + 1)B, j),

    for the key block starting at :math:`k_0`. So a program whose rows all come after
    the last key (``mB >= j``) masks nothing.

    Args:
        num_queries: ``i`` (``>= 0``).
        num_keys: ``j`` (``>= 0``).
        block_size: ``B``, rows per query block and per key block (``>= 1``).
        is_causal: whether the kernel applies the top-left causal mask.

    Returns:
        A long tensor ``(ceil(i / B), ceil(j / B))``: row ``m`` is the program of query
        block ``m``, column ``n`` key block ``n``; ``0`` never loaded, ``1`` loaded with
        no mask, ``2`` loaded and masked (:data:`SKIPPED`, :data:`UNMASKED`,
        :data:`MASKED`).

    Example:
        >>> flash_tile_kinds(40, 40, 16, is_causal=True)
        tensor([[2, 0, 0],
                [1, 2, 0],
                [1, 1, 2]])
    """
    i, j = check_sizes(
        num_queries=num_queries, num_keys=num_keys, zero_ok=("num_queries", "num_keys")
    )
    block = check_size("block_size", block_size)
    check_bool("is_causal", is_causal)
    rows = torch.arange(-(-i // block)).unsqueeze(-1)  # (T_q, 1): program m
    starts = torch.arange(-(-j // block)) * block  # (T_k,): first key of each block
    if not is_causal:
        return torch.full((rows.shape[0], starts.shape[0]), UNMASKED)
    below = torch.clamp(rows * block, max=j)  # (T_q, 1): keys every query sees
    diagonal_end = torch.clamp((rows + 1) * block, max=j)
    kinds = torch.where(starts < below, UNMASKED, SKIPPED)
    return torch.where((starts >= below) & (starts < diagonal_end), MASKED, kinds)
