"""Scaled dot-product attention, the readable reference (chapters 1-4).

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads, ``i`` query
positions, ``j`` key positions, ``d`` query/key size, ``e`` value size.

Mask convention: boolean, **True = may attend**, broadcastable to ``(..., i, j)``, as in
``torch.nn.functional.scaled_dot_product_attention``; a float mask is *added* to the
scores. This implementation materialises the ``(..., i, j)`` weights on purpose: it is
the ground truth every faster variant in the package is tested against.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_probability, validate_attention, validate_weights
from .._core import (
    add_mask,
    attention_scores,
    expand_kv_heads,
    masked_softmax,
    softmax_or_zero,
)

__all__ = ["attention_weights", "scaled_dot_product_attention"]


def attention_weights(
    query: Tensor,
    key: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    r"""The attention weights :math:`A = \operatorname{softmax}(Q K^\top \cdot s + M)`.

    These are exactly the weights that :func:`scaled_dot_product_attention` multiplies
    the values by (before dropout), so a notebook can plot them.

    Args:
        query: ``(..., h, i, d)`` (any leading dims, at least ``(i, d)``).
        key: ``(..., h_kv, j, d)``.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``.
        is_causal: top-left causal mask (query ``q`` sees keys ``k <= q``); not together
            with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: allow ``h`` to be a multiple of ``h_kv`` (grouped-query attention);
            key head ``g`` serves query heads ``g*r ... g*r + r - 1`` with
            ``r = h / h_kv``.

    Returns:
        ``(..., h, i, j)`` weights; each row sums to 1, masked entries are exactly 0 and
        a row with no visible key is all zeros (so is every row when ``j = 0``). A NaN
        score makes its whole row NaN, even where masked, as in PyTorch.

    Example:
        >>> q = k = torch.eye(2)
        >>> attention_weights(q, k, scale=100.0).round().tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    validate_weights(query, key, attn_mask, is_causal, scale, enable_gqa)
    scores, attn_mask = attention_scores(
        query, key, attn_mask, is_causal, scale, enable_gqa
    )  # (..., h, i, j) = q·kᵀ·scale; is_causal becomes a mask
    return masked_softmax(scores, attn_mask)  # (..., h, i, j)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    r"""Scaled dot-product attention,
    :math:`\operatorname{softmax}(Q K^\top / \sqrt{d} + M)\, V`.

    Same signature and semantics as
    ``torch.nn.functional.scaled_dot_product_attention``, written so every step is
    visible: scores, mask, softmax, (dropout), weighted sum. The edge cases follow
    PyTorch too: a boolean mask is applied as an additive one, so a NaN or ``+inf``
    score poisons its row even where masked; a row with no visible key, and every row
    when there are no keys (``j = 0``), gives zeros; ``d = 0`` gives zero scores, hence
    the mean of the values.

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

    Raises:
        TypeError: for non-tensors, non-floating or mixed dtypes, a non-bool flag, a
            non-numeric scale or dropout_p.
        ValueError: for mismatched ``d``/``j``/heads, batch dims that don't broadcast, a
            mask of the wrong shape, inputs on different devices, ``attn_mask`` together
            with ``is_causal=True``, ``dropout_p`` outside ``[0, 1]``.

    Returns:
        ``(..., h, i, e)``. A query with no visible key gets a zero output.

    Example:
        >>> q, k, v = torch.ones(1, 3), torch.ones(2, 3), torch.tensor([[0.0], [2.0]])
        >>> scaled_dot_product_attention(q, k, v).tolist()  # equal scores: the mean
        [[1.0]]
    """
    validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    check_probability("dropout_p", dropout_p, closed=True)  # torch allows 1: zeros
    # 1. scores: q·kᵀ·scale for every (query, key) pair; is_causal becomes a mask
    scores, attn_mask = attention_scores(
        query, key, attn_mask, is_causal, scale, enable_gqa
    )  # (..., h, i, j)
    # 2. mask: add 0 where attending is allowed, -inf where not (a float mask as is)
    if attn_mask is not None:
        scores = add_mask(scores, attn_mask)
    # 3. softmax over the keys; a row with no visible key gets zero weights
    weights = softmax_or_zero(scores, dim=-1)  # (..., h, i, j)
    # 4. dropout on the weights (training only: pass dropout_p=0.0 to evaluate)
    if dropout_p > 0.0:
        weights = torch.dropout(weights, dropout_p, train=True)
    # 5. weighted sum of the values (each key/value head serves its group of queries)
    if enable_gqa:
        value = expand_kv_heads(value, query.shape[-3])  # (..., h, j, e)
    return weights @ value  # (..., h, i, e)
