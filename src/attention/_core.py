"""Unchecked computational pieces every attention kernel shares.

One masked softmax, one grouped-query head expansion, one default scale and one
top-left causal mask, so no kernel writes its own copy. Nothing here validates its
arguments: the public functions check once at the boundary (``_checks.py``) and then
call these.

Shape legend: ``b`` batch (any number of leading dims ``...``), ``h`` query heads,
``h_kv`` key/value heads, ``i`` query positions, ``j`` key positions, ``d`` query/key
size, ``e`` value size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def default_scale(scale: float | None, d: int) -> float:
    """``scale`` as a float, or :math:`1/\\sqrt{d}` when None; 1.0 when ``d = 0``, where
    every score is an empty sum, 0, whatever the scale (even NaN or inf, as in torch).

    The one default-scale rule of the package: every kernel calls it.
    """
    if d == 0:
        return 1.0
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def expand_kv_heads(t: Tensor, num_query_heads: int) -> Tensor:
    """Repeat each key/value head for its group of query heads (grouped-query attention).

    ``t`` is ``(..., h_kv, j, *)`` with ``num_query_heads`` a multiple of ``h_kv``; key
    head ``g`` serves query heads ``g*r ... g*r + r - 1`` with ``r = h / h_kv`` (the layout
    of ``enable_gqa`` in torch and of Hugging Face's ``repeat_kv``). Returns
    ``(..., h, j, *)`` (``t`` itself when ``r = 1``).
    """
    num_repeats = num_query_heads // t.shape[-3]
    if num_repeats == 1:
        return t
    return t.repeat_interleave(num_repeats, dim=-3)


def top_left_causal(i: int, j: int, device=None) -> Tensor:
    """``(i, j)`` boolean mask, True where key ``k <= q`` (``is_causal=True`` in torch)."""
    return torch.ones(i, j, dtype=torch.bool, device=device).tril()


def masked_softmax(
    scores: Tensor, attn_mask: Tensor | None = None, dim: int = -1
) -> Tensor:
    """Softmax of ``scores`` along ``dim`` after applying ``attn_mask``; dead rows give zeros.

    ``attn_mask`` is boolean (**True = may attend**) or float (added to the scores) and
    broadcasts to ``scores``. A boolean mask is applied as an additive one (0 or -inf),
    exactly as PyTorch's reference path does, so a NaN score stays NaN even where masked.
    A slice along ``dim`` whose scores are all ``-inf`` (no visible key, or no key at
    all) gets zero weights, as ``torch.nn.functional.scaled_dot_product_attention``
    gives: its scores are replaced by zeros before the softmax (so the backward pass
    stays finite) and the weights zeroed after.
    """
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=scores.dtype).masked_fill(
                ~attn_mask, float("-inf")
            )
        scores = scores + attn_mask.to(scores.dtype)  # a float32 mask on float64 scores
    dead = torch.isneginf(scores).all(dim=dim, keepdim=True)  # (..., 1, ...) along dim
    scores = scores.masked_fill(dead, 0.0)
    return _softmax(scores, dim).masked_fill(dead, 0.0)


# --------------------------------------------------------------------------- the softmax


def _shift(x: Tensor, dim: int, *, zero_infinite: bool) -> Tensor:
    """Row maximum used as the shift; a row whose maximum is ``-inf`` gets a shift of 0.

    ``zero_infinite`` also zeroes a ``+inf`` maximum, which :func:`logsumexp` needs
    (``logsumexp([inf, 1]) = inf``) and the softmax must not do (``softmax([inf, 1])`` is
    NaN in torch: ``inf - inf``). The shift is detached: softmax is invariant to it, so
    its gradient contribution is exactly zero and detaching only saves work.
    """
    m = x.detach().amax(dim=dim, keepdim=True)
    drop = torch.isinf(m) if zero_infinite else torch.isneginf(m)
    return m.masked_fill(drop, 0.0)


def _empty(x: Tensor, dim: int) -> bool:
    """Whether the axis ``dim`` has no entries (a 0-dim tensor counts as one entry)."""
    return x.dim() > 0 and x.shape[dim] == 0


def _softmax(x: Tensor, dim: int) -> Tensor:
    """Unchecked core of :func:`softmax`."""
    if _empty(x, dim):  # nothing to normalise (amax would refuse the empty axis)
        return x.clone()
    z = torch.exp(x - _shift(x, dim, zero_infinite=False))
    return z / z.sum(dim=dim, keepdim=True)


# --------------------------------------------------------------------------- the reference kernel


def _weights(query, key, attn_mask, is_causal, scale, enable_gqa) -> Tensor:
    """Unchecked core of :func:`attention_weights`: ``(..., h, i, j)`` weights."""
    if enable_gqa:
        key = expand_kv_heads(key, query.shape[-3])  # (..., h, j, d)
    scale = default_scale(scale, query.shape[-1])
    scores = (query @ key.transpose(-2, -1)) * scale  # (..., h, i, j)
    if is_causal:
        attn_mask = top_left_causal(query.shape[-2], key.shape[-2], device=query.device)
    return masked_softmax(scores, attn_mask)  # (..., h, i, j)


def _attention(
    query, key, value, attn_mask, is_causal, scale, enable_gqa, dropout_p=0.0
):
    """Unchecked core of :func:`scaled_dot_product_attention`: ``(output, weights)``.

    ``weights`` are the ``(..., h, i, j)`` weights before dropout.
    """
    weights = _weights(query, key, attn_mask, is_causal, scale, enable_gqa)
    dropped = (
        torch.dropout(weights, dropout_p, train=True) if dropout_p > 0.0 else weights
    )
    if enable_gqa:
        value = expand_kv_heads(value, query.shape[-3])  # (..., h, j, e)
    return dropped @ value, weights  # (..., h, i, e), (..., h, i, j)


def _matmul_skipping(
    weights: Tensor, value: Tensor, hidden: Tensor | None, finite: bool | None = None
) -> Tensor:
    """``weights @ value`` in which a ``hidden`` ``(i, j)`` pair adds nothing, even a NaN value.

    A zero weight times an infinite or NaN value is NaN, so a future value would reach
    earlier queries through the matmul; written out as a masked sum it cannot. (Only
    taken when ``value`` holds such numbers; ``finite`` says so when already known.)
    Shared by the sparse, linear and LSH kernels.
    """
    if (
        hidden is None
        or value.device.type == "meta"
        or (finite if finite is not None else bool(torch.isfinite(value).all()))
    ):  # (a meta tensor has no values to look at: the shapes are the same either way)
        return weights @ value
    terms = weights.unsqueeze(-1) * value.unsqueeze(-3)  # (..., i, j, e)
    return terms.masked_fill(hidden.unsqueeze(-1), 0.0).sum(dim=-2)  # (..., i, e)


def poisoned_rows(
    query: Tensor, key: Tensor, scale: float, enable_gqa: bool, block_size: int = 512
) -> Tensor | None:
    """``(..., h, i, 1)`` True for the queries with a NaN or ``+inf`` score against *any* key.

    The package's rule for non-finite scores, the one torch's
    ``scaled_dot_product_attention`` follows: a mask is added to the scores, so a NaN or
    ``+inf`` score makes its whole row NaN even where the key is masked (or in the
    future of a causal query). The reference computes every score and gets this for free;
    a kernel that skips masked blocks calls this and fills these rows with NaN, so both
    agree. Returns None (nothing to fill) when every score is finite: checked with one
    bound, ``max|q| * max|k| * d * |scale|`` below the dtype's largest number, so the
    scores are only recomputed (a block of keys at a time) for non-finite or huge inputs.
    """
    d, j = query.shape[-1], key.shape[-2]
    if d == 0 or j == 0 or query.numel() == 0 or query.device.type == "meta":
        return None
    with torch.no_grad():
        bound = (
            query.abs().amax().to(torch.float64)
            * key.abs().amax().to(torch.float64)
            * d
            * abs(scale)
        )
        if bool(bound < torch.finfo(query.dtype).max):  # False for NaN or inf
            return None
        if enable_gqa:
            key = expand_kv_heads(key, query.shape[-3])
        bad = None
        for j0 in range(0, j, block_size):
            s = (query @ key[..., j0 : j0 + block_size, :].transpose(-2, -1)) * scale
            hit = (torch.isnan(s) | torch.isposinf(s)).any(
                dim=-1, keepdim=True
            )  # (..., i, 1)
            bad = hit if bad is None else bad | hit
    return bad if bool(bad.any()) else None
