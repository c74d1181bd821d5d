"""Unchecked computational pieces every attention kernel shares.

Each rule of the package is written once, here: the default scale, the grouped-query
head expansion, the causal mask, the conversion of a boolean mask into an additive one,
the scores ``q·kᵀ·scale`` (with ``is_causal`` turned into a mask), the max shift of a
stable softmax and the masked softmax. So every softmax variant reads "scores → modify
→ normalise → @ value", the story of FlexAttention's ``score_mod``, and no kernel writes
its own copy of a rule (``tests/test_rules.py`` checks it over the package's source).
Nothing here validates its arguments: the public functions check once at the boundary
(``_checks.py``) and then call these.

Shape legend: ``b`` batch (any number of leading dims ``...``), ``h`` query heads,
``h_kv`` key/value heads, ``i`` query positions, ``j`` key positions, ``d`` query/key
size, ``e`` value size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# --------------------------------------------------------------------------- the scores


def default_scale(scale: float | None, d: int) -> float:
    """``scale`` as a float, or :math:`1/\\sqrt{d}` when None; 1.0 when ``d = 0``, where
    every score is an empty sum, 0, whatever the scale (even NaN or inf, as in torch).

    The one default-scale rule of the package: every kernel calls it.
    """
    if d == 0:
        return 1.0
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def expand_kv_heads(t: Tensor, num_query_heads: int) -> Tensor:
    """Repeat each key/value head for its group of query heads (grouped-query
    attention).

    ``t`` is ``(..., h_kv, j, *)`` with ``num_query_heads`` a multiple of ``h_kv``; key
    head ``g`` serves query heads ``g*r ... g*r + r - 1`` with ``r = h / h_kv`` (the
    layout of ``enable_gqa`` in torch and of Hugging Face's ``repeat_kv``). Returns
    ``(..., h, j, *)`` (``t`` itself when ``r = 1``).
    """
    num_repeats = num_query_heads // t.shape[-3]
    if num_repeats == 1:
        return t
    return t.repeat_interleave(num_repeats, dim=-3)


def tril_mask(i: int, j: int, *, offset: int = 0, device=None) -> Tensor:
    """``(i, j)`` boolean mask, True where key ``k <= q + offset``: the one causal mask.

    ``offset = 0`` is the top-left mask of ``is_causal=True`` in torch;
    ``offset = j - i`` aligns the last query with the last key (bottom-right, for
    cached decoding).
    """
    return torch.ones(i, j, dtype=torch.bool, device=device).tril(offset)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask (**True = may attend**) as an additive one: 0 or -inf.

    The one conversion of the package. Adding it to the scores is how torch applies a
    boolean mask, so a NaN or ``+inf`` score stays in its row even where masked.
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, float("-inf")
    )


def attention_scores(
    query: Tensor,
    key: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The prologue every softmax variant shares: ``(scores, mask)``.

    ``scores = query @ keyᵀ · scale``, ``(..., h, i, j)``, after repeating the key
    heads for grouped-query attention (``enable_gqa``); ``scale`` None means
    :math:`1/\\sqrt{d}`. ``mask`` is ``attn_mask`` unchanged, or the top-left causal
    mask when ``is_causal``: how to apply it is the variant's choice (softmax adds it;
    sigmoid attention adds it before the sigmoid). Also the core of a tile: pass a block
    of queries and keys.
    """
    if enable_gqa:
        key = expand_kv_heads(key, query.shape[-3])  # (..., h, j, d)
    scale = default_scale(scale, query.shape[-1])
    # scaled in place: the product is a fresh tensor that autograd does not save, so a
    # tiled kernel holds one (i, block) tile, not two
    scores = (query @ key.transpose(-2, -1)).mul_(scale)
    if is_causal:
        attn_mask = tril_mask(query.shape[-2], key.shape[-2], device=query.device)
    return scores, attn_mask  # (..., h, i, j)


# -------------------------------------------------------------------------- the softmax


def max_shift(m: Tensor, *, zero_infinite: bool = False) -> Tensor:
    """The shift of a stable softmax whose row maximum (or running maximum) is ``m``.

    A row whose maximum is ``-inf`` (nothing visible yet) is shifted by 0, so that
    ``exp(-inf - 0) = 0`` instead of ``exp(-inf + inf) = NaN``. ``zero_infinite`` also
    zeroes a ``+inf`` maximum, which :func:`attention.logsumexp` needs
    (``logsumexp([inf, 1]) = inf``) and the softmax must not do (``softmax([inf, 1])``
    is NaN in torch: ``inf - inf``). The one max-shift rule of the package.
    """
    return m.masked_fill(torch.isinf(m) if zero_infinite else torch.isneginf(m), 0.0)


def row_max(x: Tensor, dim: int) -> Tensor:
    """The maximum along ``dim``, kept as a size-1 axis and detached.

    Detached because a softmax is invariant to its shift: the gradient through the
    maximum is exactly zero, and detaching only saves work.
    """
    return x.detach().amax(dim=dim, keepdim=True)


def is_empty(x: Tensor, dim: int) -> bool:
    """Whether the axis ``dim`` has no entries (a 0-dim tensor counts as one entry)."""
    return x.dim() > 0 and x.shape[dim] == 0


def stable_softmax(x: Tensor, dim: int) -> Tensor:
    """Unchecked core of :func:`attention.softmax`: ``exp(x - m) / sum exp(x - m)``."""
    if is_empty(x, dim):  # nothing to normalise (amax would refuse the empty axis)
        return x.clone()
    z = torch.exp(x - max_shift(row_max(x, dim)))
    return z / z.sum(dim=dim, keepdim=True)


def add_mask(scores: Tensor, attn_mask: Tensor) -> Tensor:
    """``scores`` plus the mask: a boolean one as 0 or -inf, a float one as it is."""
    if attn_mask.dtype == torch.bool:
        attn_mask = additive_mask(attn_mask, scores.dtype)
    return scores + attn_mask.to(scores.dtype)  # a float32 mask on float64 scores


def softmax_or_zero(scores: Tensor, dim: int = -1) -> Tensor:
    """Softmax along ``dim``, with zero weights for a row whose scores are all ``-inf``.

    Such a row has no visible key (or no key at all), and
    ``torch.nn.functional.scaled_dot_product_attention`` gives it zero weights: its
    scores are replaced by zeros before the softmax (so the backward pass stays finite)
    and the weights zeroed after.
    """
    dead = torch.isneginf(scores).all(dim=dim, keepdim=True)  # (..., 1, ...) along dim
    return stable_softmax(scores.masked_fill(dead, 0.0), dim).masked_fill(dead, 0.0)


def masked_softmax(
    scores: Tensor, attn_mask: Tensor | None = None, dim: int = -1
) -> Tensor:
    """Softmax of ``scores`` along ``dim`` after applying ``attn_mask``; dead rows: 0.

    ``attn_mask`` is boolean (**True = may attend**) or float (added to the scores) and
    broadcasts to ``scores``. A boolean mask is applied as an additive one (0 or -inf),
    as PyTorch's reference path does, so a NaN score stays NaN even where masked. A
    slice along ``dim`` with no visible key gets zero weights (:func:`softmax_or_zero`).
    """
    if attn_mask is not None:
        scores = add_mask(scores, attn_mask)
    return softmax_or_zero(scores, dim)


# ------------------------------------------------------------------- kernels' helpers


def matmul_skipping(
    weights: Tensor, value: Tensor, hidden: Tensor | None, finite: bool | None = None
) -> Tensor:
    """``weights @ value`` in which a ``hidden`` ``(i, j)`` pair adds nothing, even a
    NaN value.

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
    """``(..., h, i, 1)`` True for the queries with a NaN or ``+inf`` score against
    *any* key.

    The package's rule for non-finite scores, the one torch's
    ``scaled_dot_product_attention`` follows: a mask is added to the scores, so a NaN or
    ``+inf`` score makes its whole row NaN even where the key is masked (or in the
    future of a causal query). The reference computes every score and gets this for
    free; a kernel that skips masked blocks calls this and fills these rows with NaN, so
    both agree. Returns None (nothing to fill) when every score is finite: checked with
    one bound, ``max|q| * max|k| * d * |scale|`` below the dtype's largest number, so
    the scores are only recomputed (a block of keys at a time) for non-finite or huge
    inputs.
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
        bad = None
        for j0 in range(0, j, block_size):
            block = key[..., j0 : j0 + block_size, :]
            s, _ = attention_scores(query, block, scale=scale, enable_gqa=enable_gqa)
            hit = (torch.isnan(s) | torch.isposinf(s)).any(dim=-1, keepdim=True)
            bad = hit if bad is None else bad | hit  # (..., i, 1)
    assert bad is not None  # j > 0, so the loop ran
    return bad if bool(bad.any()) else None
