"""The unchecked cores of tiled attention: the tiles, the forward and backward passes.

Shared by :mod:`attention.efficient.tiled` (one device,
:func:`attention.tiled_attention`) and :mod:`attention.efficient._ring` (ring attention
across devices). :func:`forward` is the FlashAttention recurrence of chapter 14,
:func:`backward` the recomputing backward pass of chapter 15. Inputs: query
``(..., i, d)``, key ``(..., j, d)``, value ``(..., j, e)`` with batch dims that
broadcast, an optional mask broadcastable to ``(..., i, j)``, a float scale and a block
size ``>= 1``. Nothing here validates its arguments.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import broadcast_shapes
from .._core import attention_scores, max_shift

_INF = float("inf")


def tiles(query, key, mask, is_causal, scale, block_size):
    """Yield ``(j0, j1, r0, scores)`` for each key block ``j0:j1``.

    ``scores`` are the masked, scaled ``(..., i - r0, j1 - j0)`` scores of the queries
    ``r0:`` that can see any key of the block.
    """
    i, j = query.shape[-2], key.shape[-2]
    for j0 in range(0, j, block_size):
        j1 = min(j0 + block_size, j)
        r0 = (
            j0 if is_causal else 0
        )  # with a causal mask, queries before j0 see none of these keys
        if r0 >= i:
            break
        scores, _ = attention_scores(
            query[..., r0:, :], key[..., j0:j1, :], scale=scale
        )  # (..., i - r0, blk), scaled in place
        if is_causal:
            rows = torch.arange(r0, i, device=query.device).unsqueeze(-1)  # (i - r0, 1)
            cols = torch.arange(j0, j1, device=query.device)  # (blk,)
            scores.masked_fill_(cols > rows, -_INF)
        if mask is not None:
            # a view: the mask is sliced, never expanded (an axis of size 1 broadcasts)
            rows = slice(r0, None) if mask.shape[-2] > 1 else slice(None)
            tile = mask[..., rows, j0:j1] if mask.shape[-1] > 1 else mask[..., rows, :]
            if tile.dtype == torch.bool:
                scores = torch.where(
                    tile, scores, -_INF
                )  # broadcasts the batch dims of both
            else:
                scores = scores + tile
        yield j0, j1, r0, scores


def _sub_exp(scores: Tensor, shift: Tensor) -> Tensor:
    """``exp(scores - shift)``, in place (no new tile) if it has the tile's shape."""
    aligned = zip(reversed(scores.shape), reversed(shift.shape))
    if shift.dim() <= scores.dim() and all(s in (1, t) for t, s in aligned):
        return scores.sub_(shift).exp_()
    return torch.exp(scores - shift)  # value's batch dims are wider than the tile's


def forward(query, key, value, mask, is_causal, scale, block_size):
    """The tiled forward pass without autograd: ``(out (..., i, e), lse (..., i))``.

    A query with no visible key gets a zero output and ``lse = -inf``; a NaN (in a
    visible key, value, float mask entry or the scale) or an overflowed score makes its
    row NaN.
    """
    i, e = query.shape[-2], value.shape[-1]
    batch = broadcast_shapes(
        "batch dims", query.shape[:-2], key.shape[:-2], value.shape[:-2]
    )
    opts = {"dtype": query.dtype, "device": query.device}
    m = torch.full((*batch, i, 1), -_INF, **opts)  # (..., i, 1) running max
    l = torch.zeros((*batch, i, 1), **opts)  # noqa: E741  (..., i, 1) running sum
    acc = torch.zeros((*batch, i, e), **opts)  # (..., i, e) unnormalised output
    with torch.no_grad():
        for j0, j1, r0, scores in tiles(query, key, mask, is_causal, scale, block_size):
            m_old = m[..., r0:, :]  # views: the updates below write into m, l, acc
            m_new = torch.maximum(m_old, scores.amax(dim=-1, keepdim=True))
            shift = max_shift(m_new)  # rows with nothing visible yet: shift 0
            alpha = torch.exp(
                m_old - shift
            )  # rescales the old sums; 0 while m_old = -inf
            p = _sub_exp(
                scores, shift
            )  # (..., i - r0, blk); masked entries are exactly 0
            l[..., r0:, :] = l[..., r0:, :] * alpha + p.sum(dim=-1, keepdim=True)
            acc[..., r0:, :] = acc[..., r0:, :] * alpha + p @ value[..., j0:j1, :]
            m_old.copy_(m_new)
        dead = torch.isneginf(m)  # (..., i, 1): no visible key (or no key at all)
        out = torch.where(dead, 0.0, acc / torch.where(dead, 1.0, l))
        lse = torch.where(dead, -_INF, m + torch.log(torch.where(dead, 1.0, l)))
        if math.isnan(scale) and key.shape[-2] > 0:
            # torch adds the mask to scaled scores, so a NaN scale reaches every row,
            # even one whose keys are all masked; the masked_fill above would have
            # hidden it.
            out.fill_(math.nan)
            lse.fill_(math.nan)
    return out, lse.squeeze(-1)


def backward(query, key, value, mask, is_causal, scale, block_size, lse, dout, delta):
    """The FlashAttention-2 backward pass, recomputing each tile from the log-sum-exp.

    With ``P = exp(S - lse)`` rebuilt tile by tile, ``dV = P^T dO``, ``dP = dO V^T``,
    ``dS = P * (dP - delta)``, ``dQ = dS K s`` and ``dK = dS^T Q s``, where ``delta``
    is ``rowsum(dO * O) - dlse`` of shape ``(..., i)``. Returns ``(dq, dk, dv)`` with
    the shapes of ``query``, ``key`` and ``value`` (broadcast batch dims summed out).
    """
    # A row that saw no key has lse = -inf: use +inf, so that its P = exp(S - inf) is
    # exactly 0.
    lse = torch.where(torch.isneginf(lse), _INF, lse).unsqueeze(-1)  # (..., i, 1)
    delta = delta.unsqueeze(-1)  # (..., i, 1)
    dq = torch.zeros(
        (*dout.shape[:-1], query.shape[-1]), dtype=dout.dtype, device=dout.device
    )
    dk, dv = torch.zeros_like(key), torch.zeros_like(value)
    with torch.no_grad():
        for j0, j1, r0, scores in tiles(query, key, mask, is_causal, scale, block_size):
            p = _sub_exp(scores, lse[..., r0:, :])  # (..., i - r0, blk): the weights
            g = dout[..., r0:, :]  # (..., i - r0, e)
            blk = j1 - j0
            dv[..., j0:j1, :] += (p.transpose(-2, -1) @ g).sum_to_size(
                *value.shape[:-2], blk, value.shape[-1]
            )
            dp = g @ value[..., j0:j1, :].transpose(-2, -1)  # (..., i - r0, blk)
            ds = dp.sub_(delta[..., r0:, :]).mul_(
                p
            )  # dS = P * (dP - D), the softmax's backward
            dq[..., r0:, :] += (ds @ key[..., j0:j1, :]) * scale
            dk[..., j0:j1, :] += (
                (ds.transpose(-2, -1) @ query[..., r0:, :]) * scale
            ).sum_to_size(*key.shape[:-2], blk, key.shape[-1])
    return dq.sum_to_size(query.shape), dk, dv


class TiledAttention(torch.autograd.Function):
    """Tiled attention whose backward pass recomputes the tiles.

    It saves only q, k, v, out and lse (and the mask).
    """

    @staticmethod
    def forward(ctx, query, key, value, mask, is_causal, scale, block_size):
        out, lse = forward(query, key, value, mask, is_causal, scale, block_size)
        saved = (query, key, value, out, lse) + (() if mask is None else (mask,))
        ctx.save_for_backward(*saved)
        ctx.options = (is_causal, scale, block_size)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        query, key, value, out, lse, *mask = ctx.saved_tensors
        is_causal, scale, block_size = ctx.options
        delta = (dout * out).sum(
            dim=-1
        ) - dlse  # D = rowsum(dO * O), less the lse's gradient
        dq, dk, dv = backward(
            query,
            key,
            value,
            mask[0] if mask else None,
            is_causal,
            scale,
            block_size,
            lse,
            dout,
            delta,
        )
        return dq, dk, dv, None, None, None, None
