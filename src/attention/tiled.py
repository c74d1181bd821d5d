r"""Memory-efficient exact attention: the online softmax and tiled attention (chapters 13, 14).

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads (``h_kv`` key/value
heads), ``i`` query positions, ``j`` key positions, ``d`` query/key size, ``e`` value size,
``n`` any softmax axis.

The online softmax :cite:`milakov2018online` keeps a running maximum ``m`` and a running
sum ``l`` of :math:`e^{x - m}`; when a new element (or block) raises the maximum, the old
sum is rescaled:

.. math::

    m_\text{new} = \max(m, x), \qquad
    l_\text{new} = l\, e^{m - m_\text{new}} + e^{x - m_\text{new}}.

Attention applies the same recurrence to a running output as well, one key/value block
at a time :cite:`rabe2021self,dao2022flashattention`, so the ``(i, j)`` score matrix is
never built: only ``(i, block)`` tiles are (chapter 13). The backward pass recomputes the
tiles from the saved per-row log-sum-exp instead of storing them, as FlashAttention-2
does :cite:`dao2023flashattention2`, so training memory is linear in the sequence too
(chapter 14).

Mask convention: boolean, **True = may attend**, broadcastable to ``(..., i, j)``, as in
``torch.nn.functional.scaled_dot_product_attention``; a float mask is *added* to the
scores. ``is_causal`` is top-left (query ``q`` sees keys ``k <= q``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._checks import (
    broadcast_shapes,
    check_bool,
    check_int,
    check_size,
    check_tensor,
    validate_attention,
)

__all__ = ["online_softmax", "tiled_attention"]

_INF = float("inf")


def _shift(m: Tensor) -> Tensor:
    """The running max as a shift: rows that have only seen ``-inf`` are shifted by 0.

    Only ``-inf`` is replaced: a ``+inf`` or NaN maximum stays, so that an overflowed or
    NaN row comes out NaN, as in ``torch.softmax``.
    """
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


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
        block_size: elements read per step of the recurrence (``>= 1``; a block larger
            than the axis reads it whole).

    Returns:
        A tensor of the shape of ``x``, equal to :func:`~attention.softmax` (a row that is
        entirely ``-inf`` gives NaN, as there; a NaN or ``+inf`` makes its row NaN, as in
        ``torch.softmax``).

    Example:
        >>> x = torch.tensor([1.0, 3.0, 2.0])
        >>> torch.allclose(online_softmax(x), torch.softmax(x, -1))
        True
    """
    check_tensor("x", x, floating=True, min_dim=1)
    block_size = check_int("block_size", block_size, minimum=1)
    dim = check_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must lie in [{-x.dim()}, {x.dim() - 1}] for a {x.dim()}-d x, got {dim}")
    x_last = x.movedim(dim, -1)  # (..., n)
    n = x_last.shape[-1]
    m = torch.full(x_last.shape[:-1] + (1,), -_INF, dtype=x.dtype, device=x.device)
    l = torch.zeros_like(m)  # noqa: E741 (the paper's name)
    for start in range(0, n, block_size):
        block = x_last[..., start : start + block_size]  # (..., block)
        m_new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        shift = _shift(m_new)
        l = l * torch.exp(m - shift) + torch.exp(block - shift).sum(dim=-1, keepdim=True)  # noqa: E741
        m = m_new
    out = torch.exp(x_last - _shift(m)) / l  # (..., n)
    return out.movedim(-1, dim)


def online_softmax_blocked(x: Tensor, dim: int = -1, *, block_size: int = 128) -> Tensor:
    """The blockwise online softmax: :func:`online_softmax` reading ``block_size`` at a time."""
    return online_softmax(x, dim, block_size=block_size)


# ----------------------------------------------------------------------------- the kernels
# Unchecked cores, shared with ring attention (distributed.py). Inputs: query (..., i, d),
# key (..., j, d), value (..., j, e) with batch dims that broadcast, an optional mask
# broadcastable to (..., i, j), a float scale and a block size >= 1.


def _tiles(query, key, mask, is_causal, scale, block_size):
    """Yield ``(j0, j1, r0, scores)`` for each key block: the masked, scaled ``(..., i - r0, j1 - j0)``
    scores of the queries ``r0:`` that can see any key of block ``j0:j1``."""
    i, j = query.shape[-2], key.shape[-2]
    for j0 in range(0, j, block_size):
        j1 = min(j0 + block_size, j)
        r0 = j0 if is_causal else 0  # with a causal mask, queries before j0 see none of these keys
        if r0 >= i:
            break
        scores = query[..., r0:, :] @ key[..., j0:j1, :].transpose(-2, -1)  # (..., i - r0, blk)
        scores.mul_(scale)  # in place: the kernels run without autograd, and tiles are the memory
        if is_causal:
            rows = torch.arange(r0, i, device=query.device).unsqueeze(-1)  # (i - r0, 1)
            cols = torch.arange(j0, j1, device=query.device)  # (blk,)
            scores.masked_fill_(cols > rows, -_INF)
        if mask is not None:
            tile = mask[..., r0:, j0:j1]  # a view: the mask is sliced, never expanded
            if tile.dtype == torch.bool:
                scores = torch.where(tile, scores, -_INF)  # broadcasts the batch dims of both
            else:
                scores = scores + tile
        yield j0, j1, r0, scores


def _sub_exp(scores: Tensor, shift: Tensor) -> Tensor:
    """``exp(scores - shift)``, in place when the result has the tile's shape (no new tile)."""
    aligned = zip(reversed(scores.shape), reversed(shift.shape))
    if shift.dim() <= scores.dim() and all(s in (1, t) for t, s in aligned):
        return scores.sub_(shift).exp_()
    return torch.exp(scores - shift)  # value's batch dims are wider than the tile's


def _forward(query, key, value, mask, is_causal, scale, block_size):
    """The tiled forward pass without autograd: ``(out (..., i, e), lse (..., i))``.

    A query with no visible key gets a zero output and ``lse = -inf``; a NaN (in a visible
    key, value, float mask entry or the scale) or an overflowed score makes its row NaN.
    """
    i, e = query.shape[-2], value.shape[-1]
    batch = broadcast_shapes("batch dims", query.shape[:-2], key.shape[:-2], value.shape[:-2])
    opts = {"dtype": query.dtype, "device": query.device}
    m = torch.full((*batch, i, 1), -_INF, **opts)  # (..., i, 1) running max
    l = torch.zeros((*batch, i, 1), **opts)  # noqa: E741  (..., i, 1) running sum
    acc = torch.zeros((*batch, i, e), **opts)  # (..., i, e) unnormalised output
    with torch.no_grad():
        for j0, j1, r0, scores in _tiles(query, key, mask, is_causal, scale, block_size):
            m_old = m[..., r0:, :]  # views: the updates below write into m, l, acc
            m_new = torch.maximum(m_old, scores.amax(dim=-1, keepdim=True))
            shift = _shift(m_new)  # rows with nothing visible yet stay at shift 0
            alpha = torch.exp(m_old - shift)  # rescales the old sums; 0 while m_old = -inf
            p = _sub_exp(scores, shift)  # (..., i - r0, blk); masked entries are exactly 0
            l[..., r0:, :] = l[..., r0:, :] * alpha + p.sum(dim=-1, keepdim=True)
            acc[..., r0:, :] = acc[..., r0:, :] * alpha + p @ value[..., j0:j1, :]
            m_old.copy_(m_new)
        dead = torch.isneginf(m)  # (..., i, 1): no visible key (or no key at all)
        out = torch.where(dead, 0.0, acc / torch.where(dead, 1.0, l))
        lse = torch.where(dead, -_INF, m + torch.log(torch.where(dead, 1.0, l)))
        if math.isnan(scale) and key.shape[-2] > 0:
            # torch adds the mask to scaled scores, so a NaN scale reaches every row, even
            # one whose keys are all masked; the masked_fill above would have hidden it.
            out.fill_(math.nan)
            lse.fill_(math.nan)
    return out, lse.squeeze(-1)


def _backward(query, key, value, mask, is_causal, scale, block_size, lse, dout, delta):
    """The FlashAttention-2 backward pass, recomputing each tile from the log-sum-exp.

    With ``P = exp(S - lse)`` rebuilt tile by tile, ``dV = P^T dO``, ``dP = dO V^T``,
    ``dS = P * (dP - delta)``, ``dQ = dS K s`` and ``dK = dS^T Q s``, where ``delta`` is
    ``rowsum(dO * O) - dlse`` of shape ``(..., i)``. Returns ``(dq, dk, dv)`` with the shapes
    of ``query``, ``key`` and ``value`` (broadcast batch dims summed out).
    """
    # A row that saw no key has lse = -inf: use +inf so its P = exp(S - inf) is exactly 0.
    lse = torch.where(torch.isneginf(lse), _INF, lse).unsqueeze(-1)  # (..., i, 1)
    delta = delta.unsqueeze(-1)  # (..., i, 1)
    dq = torch.zeros((*dout.shape[:-1], query.shape[-1]), dtype=dout.dtype, device=dout.device)
    dk, dv = torch.zeros_like(key), torch.zeros_like(value)
    with torch.no_grad():
        for j0, j1, r0, scores in _tiles(query, key, mask, is_causal, scale, block_size):
            p = _sub_exp(scores, lse[..., r0:, :])  # (..., i - r0, blk): the weights
            g = dout[..., r0:, :]  # (..., i - r0, e)
            blk = j1 - j0
            dv[..., j0:j1, :] += (p.transpose(-2, -1) @ g).sum_to_size(*value.shape[:-2], blk, value.shape[-1])
            dp = g @ value[..., j0:j1, :].transpose(-2, -1)  # (..., i - r0, blk)
            ds = dp.sub_(delta[..., r0:, :]).mul_(p)  # dS = P * (dP - D), the softmax's backward
            dq[..., r0:, :] += (ds @ key[..., j0:j1, :]) * scale
            dk[..., j0:j1, :] += ((ds.transpose(-2, -1) @ query[..., r0:, :]) * scale).sum_to_size(
                *key.shape[:-2], blk, key.shape[-1]
            )
    return dq.sum_to_size(query.shape), dk, dv


class _TiledAttention(torch.autograd.Function):
    """Tiled attention whose backward recomputes the tiles: saves only q, k, v, out, lse (and the mask)."""

    @staticmethod
    def forward(ctx, query, key, value, mask, is_causal, scale, block_size):
        out, lse = _forward(query, key, value, mask, is_causal, scale, block_size)
        saved = (query, key, value, out, lse) + (() if mask is None else (mask,))
        ctx.save_for_backward(*saved)
        ctx.options = (is_causal, scale, block_size)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        query, key, value, out, lse, *mask = ctx.saved_tensors
        is_causal, scale, block_size = ctx.options
        delta = (dout * out).sum(dim=-1) - dlse  # D = rowsum(dO * O), less the lse's gradient
        dq, dk, dv = _backward(
            query, key, value, mask[0] if mask else None, is_causal, scale, block_size, lse, dout, delta
        )
        return dq, dk, dv, None, None, None, None


# ----------------------------------------------------------------------------- public function


def _validate(query, key, value, attn_mask, is_causal, scale, enable_gqa, block_size, return_lse):
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
    r"""Exact softmax attention, one key/value block at a time (the FlashAttention recurrence).

    **Forward.** For each block of ``block_size`` keys, with scores
    :math:`S = Q K_\text{blk}^\top s` (an ``(i, block)`` tile), the running row max ``m``,
    row sum ``l`` and unnormalised output ``acc`` are updated
    :cite:`milakov2018online,rabe2021self,dao2022flashattention`:

    .. math::

        m' = \max(m, \operatorname{rowmax} S), \quad
        l' = l\, e^{m - m'} + \operatorname{rowsum} e^{S - m'}, \quad
        \text{acc}' = \text{acc}\, e^{m - m'} + e^{S - m'} V_\text{blk},

    and at the end :math:`O = \text{acc} / l` and :math:`\text{lse} = m + \log l`. The
    ``(i, j)`` matrix is never built. With ``is_causal`` a key block starting at ``j0``
    only meets the queries ``q >= j0``, which skips the upper triangle.

    **Backward** (FlashAttention-2 :cite:`dao2023flashattention2`). Only q, k, v, the output
    and the log-sum-exp are saved (and the mask, when one is given). Each tile's weights
    are rebuilt as :math:`P = e^{S - \text{lse}}`, and with
    :math:`D = \operatorname{rowsum}(dO \circ O)`:

    .. math::

        dV \mathrel{+}= P^\top dO, \quad dP = dO\, V_\text{blk}^\top, \quad
        dS = P \circ (dP - D), \quad dQ \mathrel{+}= dS\, K_\text{blk}\, s, \quad
        dK_\text{blk} = dS^\top Q\, s.

    A gradient flowing into the returned log-sum-exp adds :math:`P \circ d\text{lse}` to
    :math:`dS`. So memory is :math:`O(i \cdot \text{block} + (i + j)(d + e))` in both passes
    instead of :math:`O(i \cdot j)`. The backward is not itself differentiable (no
    second derivatives).

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
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``; key/value head
            ``g`` serves query heads ``g*r ... g*r + r - 1`` with ``r = h / h_kv`` (no copy
            of the keys is made).
        block_size: keys per block (``>= 1``; a block larger than ``j`` is clamped to it).
        return_lse: also return the log-sum-exp of each row's scaled, masked scores.

    Returns:
        ``(..., h, i, e)``, equal to ``torch.nn.functional.scaled_dot_product_attention``:
        a query with no visible key (or ``j = 0``) gets a zero output and a zero gradient;
        NaN in a visible input, in a float mask or in ``scale`` propagates as in torch.
        With ``return_lse`` always the pair ``(output, lse)``, ``lse`` of shape
        ``(..., h, i)`` (``-inf`` for a query with no visible key), differentiable too.

    Example:
        >>> q, k, v = torch.randn(5, 4), torch.randn(7, 4), torch.randn(7, 3)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        >>> torch.allclose(tiled_attention(q, k, v, block_size=3), ref, atol=1e-6)
        True
    """
    _validate(query, key, value, attn_mask, is_causal, scale, enable_gqa, block_size, return_lse)
    d, j = query.shape[-1], key.shape[-2]
    # With d = 0 every score is an empty sum, 0, whatever the scale (as in torch).
    scale = 1.0 if d == 0 else (1.0 / math.sqrt(d) if scale is None else float(scale))
    block_size = min(block_size, max(j, 1))
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.to(query.dtype)  # a float32 mask on float64 scores, as torch allows
    q, k, v, mask = query, key, value, attn_mask
    if mask is not None and mask.dim() < 2:  # a (j,) or scalar mask: give it an (i, j) view
        mask = mask.reshape((1,) * (2 - mask.dim()) + tuple(mask.shape))
    if enable_gqa:  # (..., h, i, d) -> (..., h_kv, r, i, d); keys get a size-1 axis r
        q = query.unflatten(-3, (key.shape[-3], query.shape[-3] // key.shape[-3]))
        k, v = key.unsqueeze(-3), value.unsqueeze(-3)
        if mask is not None and mask.dim() >= 3:
            mask = mask.unflatten(-3, q.shape[-4:-2]) if mask.shape[-3] > 1 else mask.unsqueeze(-3)
    out, lse = _TiledAttention.apply(q, k, v, mask, is_causal, scale, block_size)
    if enable_gqa:
        out, lse = out.flatten(-4, -3), lse.flatten(-3, -2)  # back to (..., h, i, *)
    return (out, lse) if return_lse else out
