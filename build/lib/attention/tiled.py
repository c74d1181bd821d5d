r"""Memory-efficient exact attention: the online softmax and tiled attention (chapter 12).

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads, ``i`` query
positions, ``j`` key positions, ``d`` query/key size, ``e`` value size, ``n`` any softmax
axis.

The online softmax :cite:`milakov2018online` keeps a running maximum ``m`` and a running
sum ``l`` of :math:`e^{x - m}`; when a new element (or block) raises the maximum, the old
sum is rescaled:

.. math::

    m_\text{new} = \max(m, x), \qquad
    l_\text{new} = l\, e^{m - m_\text{new}} + e^{x - m_\text{new}}.

Attention applies the same recurrence to a running output as well, one key/value block
at a time :cite:`rabe2021self,dao2022flashattention`, so the ``(i, j)`` score matrix is
never built: only ``(i, block)`` tiles are.

Mask convention: boolean, **True = may attend**, broadcastable to ``(..., i, j)``, as in
``torch.nn.functional.scaled_dot_product_attention``; a float mask is *added* to the
scores. ``is_causal`` is top-left (query ``q`` sees keys ``k <= q``).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from ._checks import broadcast_shapes, check_int, check_mask, check_qkv, check_tensor

__all__ = ["online_softmax", "online_softmax_blocked", "tiled_attention"]


def _finite_or_zero(m: Tensor) -> Tensor:
    """The running max as a shift: rows that have only seen ``-inf`` are shifted by 0."""
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def online_softmax(x: Tensor, dim: int = -1, *, block_size: int = 1) -> Tensor:
    r"""Softmax along ``dim`` with the one-pass online normaliser :cite:`milakov2018online`.

    One pass over the row computes the maximum and the normaliser together, element by
    element (``block_size=1``) or a block at a time:

    .. math::

        m_k = \max(m_{k-1}, x_k), \qquad
        l_k = l_{k-1}\, e^{m_{k-1} - m_k} + e^{x_k - m_k},

    starting from :math:`m_0 = -\infty, l_0 = 0`. Then :math:`\operatorname{softmax}(x)_k
    = e^{x_k - m} / l`. The two passes of :func:`~attention.two_pass_softmax` that find the
    max and then the sum become one; the loop is explicit so the recurrence is visible.

    Args:
        x: scores of any shape ``(..., n, ...)``.
        dim: the axis to normalise over.
        block_size: elements read per step of the recurrence (``>= 1``).

    Returns:
        A tensor of the shape of ``x``, equal to :func:`~attention.softmax` (a row that is
        entirely ``-inf`` gives NaN, as there).

    Example:
        >>> x = torch.tensor([1.0, 3.0, 2.0])
        >>> torch.allclose(online_softmax(x), torch.softmax(x, -1))
        True
    """
    check_tensor("x", x, floating=True, min_dim=1)
    block_size = check_int("block_size", block_size, minimum=1)
    x_last = x.movedim(dim, -1)  # (..., n)
    n = x_last.shape[-1]
    m = torch.full(x_last.shape[:-1] + (1,), float("-inf"), dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)  # noqa: E741 (the paper's name)
    for start in range(0, n, block_size):
        block = x_last[..., start : start + block_size]  # (..., block)
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        shift = _finite_or_zero(m_new)
        l = l * torch.exp(m - shift) + torch.exp(block - shift).sum(dim=-1, keepdim=True)  # noqa: E741
        m = m_new
    out = torch.exp(x_last - _finite_or_zero(m)) / l  # (..., n)
    return out.movedim(-1, dim)


def online_softmax_blocked(x: Tensor, dim: int = -1, *, block_size: int = 128) -> Tensor:
    """The blockwise online softmax: :func:`online_softmax` reading ``block_size`` at a time."""
    return online_softmax(x, dim, block_size=block_size)


def _validate(query, key, value, attn_mask, block_size, is_causal, scale, return_lse):
    check_qkv(query, key, value)
    batch = broadcast_shapes(
        "the batch dims of query, key and value", query.shape[:-2], key.shape[:-2], value.shape[:-2]
    )
    check_int("block_size", block_size, minimum=1)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if is_causal and attn_mask is not None:
        raise ValueError(
            "pass either attn_mask or is_causal=True, not both (fold the causal "
            "pattern into the mask with combine_masks)"
        )
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if attn_mask is not None:
        check_mask(attn_mask, query.dtype, (*batch, query.shape[-2], key.shape[-2]))


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    block_size: int = 128,
    is_causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    attn_mask: Tensor | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Exact softmax attention, one key/value block at a time (the FlashAttention recurrence).

    For each block of ``block_size`` keys, with scores :math:`S = Q K_\text{blk}^\top s`
    (an ``(i, block)`` tile), the running row max ``m``, row sum ``l`` and unnormalised
    output ``acc`` are updated :cite:`milakov2018online,rabe2021self,dao2022flashattention`:

    .. math::

        m' = \max(m, \operatorname{rowmax} S), \quad
        l' = l\, e^{m - m'} + \operatorname{rowsum} e^{S - m'}, \quad
        \text{acc}' = \text{acc}\, e^{m - m'} + e^{S - m'} V_\text{blk},

    and at the end :math:`O = \text{acc} / l`. The ``(i, j)`` matrix is never built, so
    the extra memory is :math:`O(i \cdot \text{block})` instead of :math:`O(i \cdot j)`.
    With ``is_causal`` a key block starting at ``j0`` only meets the queries ``q >= j0``
    (the others cannot see it), which skips the upper triangle.

    The backward pass here is plain autograd, which keeps the tiles; FlashAttention instead
    recomputes them from the saved log-sum-exp.

    Args:
        query: ``(..., i, d)``.
        key: ``(..., j, d)``.
        value: ``(..., j, e)``.
        block_size: keys per block (``>= 1``).
        is_causal: top-left causal mask (query ``q`` sees keys ``k <= q``); not together
            with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        return_lse: also return the log-sum-exp of each row's scaled, masked scores.
        attn_mask: optional boolean (**True = may attend**) or float (added to the
            scores) mask broadcastable to ``(..., i, j)``; sliced per block, never
            expanded.

    Returns:
        ``(..., i, e)``, equal to :func:`~attention.scaled_dot_product_attention`; a query
        with no visible key gets a zero output. With ``return_lse``, the pair
        ``(output, lse)`` with ``lse`` of shape ``(..., i)`` (``-inf`` for such a query).

    Example:
        >>> q, k, v = torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 3)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        >>> torch.allclose(tiled_attention(q, k, v, block_size=3), ref, atol=1e-6)
        True
    """
    _validate(query, key, value, attn_mask, block_size, is_causal, scale, return_lse)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    i, j, e = query.shape[-2], key.shape[-2], value.shape[-1]
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    opts = {"dtype": query.dtype, "device": query.device}
    # A broadcast view of the mask (zero strides, no copy) so every tile is a plain slice.
    mask = None if attn_mask is None else torch.broadcast_to(attn_mask, (*batch, i, j))

    m = torch.full((*batch, i, 1), float("-inf"), **opts)  # (..., i, 1) running max
    l = torch.zeros((*batch, i, 1), **opts)  # noqa: E741  (..., i, 1) running sum
    acc = torch.zeros((*batch, i, e), **opts)  # (..., i, e) unnormalised output
    for j0 in range(0, j, block_size):
        j1 = min(j0 + block_size, j)
        r0 = j0 if is_causal else 0  # queries before j0 see none of these keys
        if r0 >= i:
            break
        q = query[..., r0:, :]  # (..., i - r0, d)
        scores = (q @ key[..., j0:j1, :].transpose(-2, -1)) * scale  # (..., i - r0, block)
        if is_causal:
            rows = torch.arange(r0, i, device=query.device).unsqueeze(-1)  # (i - r0, 1)
            cols = torch.arange(j0, j1, device=query.device)  # (block,)
            scores = scores.masked_fill(cols > rows, float("-inf"))
        if mask is not None:
            tile = mask[..., r0:, j0:j1]  # (..., i - r0, block), a view
            if tile.dtype == torch.bool:
                scores = scores.masked_fill(~tile, float("-inf"))
            else:
                scores = scores + tile
        # The max is only a shift (softmax does not depend on it), so it is detached:
        # its gradient contributions cancel exactly.
        m_old = m[..., r0:, :]
        m_new = torch.maximum(m_old, scores.detach().amax(dim=-1, keepdim=True))
        shift = _finite_or_zero(m_new)  # rows with nothing visible yet stay at shift 0
        p = torch.exp(scores - shift)  # (..., i - r0, block); masked entries are exactly 0
        alpha = torch.exp(m_old - shift)  # rescales the old sums; 0 while m_old = -inf
        l_new = l[..., r0:, :] * alpha + p.sum(dim=-1, keepdim=True)
        acc_new = acc[..., r0:, :] * alpha + p @ value[..., j0:j1, :]  # (..., i - r0, e)
        if r0 == 0:
            m, l, acc = m_new, l_new, acc_new  # noqa: E741
        else:  # out of place, so autograd sees every version
            m = torch.cat([m[..., :r0, :], m_new], dim=-2)
            l = torch.cat([l[..., :r0, :], l_new], dim=-2)  # noqa: E741
            acc = torch.cat([acc[..., :r0, :], acc_new], dim=-2)

    seen = l > 0  # (..., i, 1); False for a query with no visible key
    out = torch.where(seen, acc / torch.where(seen, l, torch.ones_like(l)), torch.zeros_like(acc))
    if not return_lse:
        return out
    lse = m + torch.log(torch.where(seen, l, torch.ones_like(l)))  # (..., i, 1)
    lse = torch.where(seen, lse, torch.full_like(lse, float("-inf")))
    return out, lse.squeeze(-1)
