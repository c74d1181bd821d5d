"""Scaled dot-product attention, the readable reference (chapters 01-04).

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads, ``i`` query
positions, ``j`` key positions, ``d`` query/key size, ``e`` value size.

Mask convention: boolean, **True = may attend**, broadcastable to ``(..., i, j)``, as in
``torch.nn.functional.scaled_dot_product_attention``; a float mask is *added* to the
scores. This implementation materialises the ``(..., i, j)`` weights on purpose: it is
the ground truth every faster variant in the package is tested against.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from ._checks import broadcast_shapes, check_mask, check_qkv
from .masks import causal_mask
from .softmax import softmax

__all__ = ["attention_weights", "scaled_dot_product_attention"]


def _validate(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """The boundary checks of the two public functions; returns the scores' shape."""
    check_qkv(query, key, value)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if is_causal and attn_mask is not None:
        raise ValueError(
            "pass either attn_mask or is_causal=True, not both (fold the causal "
            "pattern into the mask with combine_masks)"
        )
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must lie in [0, 1), got {dropout_p}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")

    q_batch, k_batch = tuple(query.shape[:-2]), tuple(key.shape[:-2])
    v_batch = tuple(value.shape[:-2]) if value is not None else k_batch
    if enable_gqa:
        if query.dim() < 3 or key.dim() < 3:
            raise ValueError(
                "enable_gqa=True needs a heads axis: query and key of shape (..., h, i, d), "
                f"got {tuple(query.shape)} and {tuple(key.shape)}"
            )
        hq, hk = query.shape[-3], key.shape[-3]
        hv = value.shape[-3] if value is not None else hk
        if hk != hv:
            raise ValueError(f"key and value must have the same number of heads, got {hk} and {hv}")
        if hk == 0 or hq % hk != 0:
            raise ValueError(
                "with enable_gqa=True the query heads must be a multiple of the key/value "
                f"heads, got {hq} query heads and {hk} key/value heads"
            )
        q_batch, k_batch, v_batch = q_batch[:-1], k_batch[:-1], v_batch[:-1]
        heads = (hq,)
    else:
        if query.dim() >= 4 and key.dim() >= 4:  # (b, h, i, d): name the heads axis
            hq, hk = query.shape[-3], key.shape[-3]
            if hq != hk and hk != 1 and hq != 1:
                raise ValueError(
                    f"query has {hq} heads but key has {hk}; they must match "
                    "(or pass enable_gqa=True for grouped-query attention)"
                )
        heads = ()
    batch = broadcast_shapes("the batch dims of query, key and value", q_batch, k_batch, v_batch)
    scores_shape = (*batch, *heads, query.shape[-2], key.shape[-2])
    if attn_mask is not None:
        check_mask(attn_mask, query.dtype, scores_shape)
    return scores_shape


def _expand_kv_heads(query: Tensor, t: Tensor) -> Tensor:
    """Repeat each key/value head for its group of query heads: (..., hk, j, *) -> (..., hq, j, *)."""
    groups = query.shape[-3] // t.shape[-3]
    return t.repeat_interleave(groups, dim=-3)


def _weights(query, key, attn_mask, is_causal, scale, enable_gqa) -> Tensor:
    """Unchecked core of :func:`attention_weights`."""
    if enable_gqa:
        key = _expand_kv_heads(query, key)
    d = query.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    scores = (query @ key.transpose(-2, -1)) * scale  # (..., i, j)
    if is_causal:
        attn_mask = causal_mask(query.shape[-2], key.shape[-2], device=query.device)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    # A row with no visible key would be 0/0 = NaN. Like torch, return zero weights for
    # it: replace its scores by zeros before the softmax (so the backward pass stays
    # finite) and zero the weights after.
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)  # (..., i, 1)
    scores = scores.masked_fill(dead, 0.0)
    return softmax(scores, dim=-1).masked_fill(dead, 0.0)  # (..., i, j)


def attention_weights(
    query: Tensor,
    key: Tensor,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    r"""The attention weights :math:`A = \operatorname{softmax}(Q K^\top \cdot s + M)`.

    These are exactly the weights that :func:`scaled_dot_product_attention` multiplies the
    values by (before dropout), so a notebook can plot them.

    Args:
        query: ``(..., h, i, d)`` (any leading dims, at least ``(i, d)``).
        key: ``(..., h_kv, j, d)``.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``.
        is_causal: top-left causal mask (query ``q`` sees keys ``k <= q``); not together
            with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: allow ``h`` to be a multiple of ``h_kv`` (grouped-query attention);
            key head ``g`` serves query heads ``g*r ... g*r + r - 1`` with ``r = h / h_kv``.

    Returns:
        ``(..., h, i, j)`` weights; each row sums to 1, masked entries are exactly 0 and a
        row with no visible key is all zeros.

    Example:
        >>> q = k = torch.eye(2)
        >>> attention_weights(q, k, scale=100.0).round().tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    _validate(query, key, None, attn_mask, 0.0, is_causal, scale, enable_gqa)
    return _weights(query, key, attn_mask, is_causal, scale, enable_gqa)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    r"""Scaled dot-product attention, :math:`\operatorname{softmax}(Q K^\top / \sqrt{d} + M)\, V`.

    Same signature and semantics as ``torch.nn.functional.scaled_dot_product_attention``,
    written so every step is visible: scores, mask, softmax, (dropout), weighted sum.

    Args:
        query: ``(..., h, i, d)``.
        key: ``(..., h_kv, j, d)``.
        value: ``(..., h_kv, j, e)``.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``.
        dropout_p: probability of zeroing a weight (applied always when > 0, as in
            PyTorch; pass 0.0 at evaluation time).
        is_causal: top-left causal mask; not together with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.

    Returns:
        ``(..., h, i, e)``. A query with no visible key gets a zero output.

    Example:
        >>> q, k, v = torch.ones(1, 3), torch.ones(2, 3), torch.tensor([[0.0], [2.0]])
        >>> scaled_dot_product_attention(q, k, v).tolist()  # equal scores: the mean
        [[1.0]]
    """
    _validate(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    weights = _weights(query, key, attn_mask, is_causal, scale, enable_gqa)  # (..., h, i, j)
    if dropout_p > 0.0:
        weights = torch.dropout(weights, dropout_p, train=True)
    if enable_gqa:
        value = _expand_kv_heads(query, value)
    return weights @ value  # (..., h, i, e)
