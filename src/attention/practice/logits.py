"""Keeping attention logits in range: soft-capping and QK-norm (chapter 18).

Shape legend: ``b`` batch (any number of leading dims), ``h`` query heads, ``h_kv``
key/value heads, ``i`` query positions, ``j`` key positions, ``d`` query/key size,
``e`` value size.

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``, as
in ``torch.nn.functional.scaled_dot_product_attention``; a float mask is added to the
scores.

A score :math:`q \\cdot k / \\sqrt{d}` has no upper bound: when queries and keys grow
during training, the softmax saturates into a one-hot row (entropy near 0) and its
gradients vanish, a known source of loss spikes in large models. Two remedies:

* **Soft-capping** (Gemma 2): pass every score through :math:`c \\tanh(s / c)` before
  the mask, a smooth clamp to ``(-c, c)`` that is the identity for ``|s| << c``
  (:func:`soft_cap`, :func:`softcap_attention`).
* **QK-norm** (Henry et al., 2020; Dehghani et al., 2023; OLMo 2, Qwen3, Gemma 3):
  normalise each query and key vector before the dot product. With RMS normalisation
  :math:`\\hat q = q / \\operatorname{rms}(q)` (:func:`qk_norm`),
  :math:`|\\hat q| = \\sqrt d`, so
  :math:`|\\hat q \\cdot \\hat k| / \\sqrt d \\le \\sqrt d` (times the learned scales).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_positive, check_real, check_tensor, validate_attention
from .._core import attention_scores, expand_kv_heads, masked_softmax

# The facade re-exports the library names (the first 2); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "soft_cap",
    "qk_norm",
    "softcap_attention",
]


def soft_cap(scores: Tensor, cap: float) -> Tensor:
    r"""Logit soft-capping, :math:`c \tanh(s / c)`: a smooth clamp to ``(-c, c)``.

    Its slope is :math:`1 - \tanh^2(s/c)`: 1 at 0 (small scores pass unchanged), 0 far
    out (large scores stop growing). Apply it to the raw scores *before* the mask: a
    ``-inf`` from a mask would come out as ``-c``, a visible key.

    Args:
        scores: any shape, e.g. ``(..., h, i, j)``.
        cap: :math:`c > 0` (Gemma 2 uses 50 for attention, 30 for the final logits).

    Returns:
        Same shape and dtype as ``scores``.

    Example:
        >>> capped = soft_cap(torch.tensor([0.0, 1.0, 100.0]), 5.0)
        >>> [round(s, 3) for s in capped.tolist()]
        [0.0, 0.987, 5.0]
    """
    check_tensor("scores", scores, floating=True)
    cap = check_positive("cap", cap)
    return cap * torch.tanh(scores / cap)


def qk_norm(x: Tensor, weight: Tensor | None = None, *, eps: float = 1e-6) -> Tensor:
    r"""QK-norm as RMS normalisation of each query or key vector (per head).

    .. math::
        \hat x = \frac{x}{\sqrt{\tfrac1d \sum_k x_k^2 + \epsilon}} \odot w

    Without ``weight`` and with :math:`\epsilon = 0`, every row has length
    :math:`\sqrt d`, so :math:`\hat q \cdot \hat k / \sqrt d = \sqrt d \cos(q, k)` lies
    in :math:`[-\sqrt d, \sqrt d]` (Henry et al. learn the scale instead; ViT-22B uses
    LayerNorm, which also subtracts the mean). The mean square is taken of ``x`` divided
    by its largest entry, so rows whose square overflows or underflows the dtype
    (``1e30`` in float32, ``300`` in float16) are normalised too.

    Args:
        x: ``(..., d)`` queries or keys, e.g. ``(b, h, i, d)``.
        weight: optional ``(d,)`` learned gain (the per-head-dim RMSNorm weight of
            Qwen3 or Gemma 3).
        eps: added to the mean square, ``>= 0``.

    Returns:
        Same shape as ``x``.

    Example:
        >>> x = torch.tensor([[3.0, 4.0]])
        >>> qk_norm(x, eps=0.0).square().sum().item()  # |x| = sqrt(d)
        2.0
    """
    check_tensor("x", x, floating=True, min_dim=1)
    eps = check_real("eps", eps)
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if weight is not None:
        check_tensor("weight", weight, floating=True)
        if tuple(weight.shape) != (x.shape[-1],):
            raise ValueError(
                f"weight must have shape (d,) = ({x.shape[-1]},), got "
                f"{tuple(weight.shape)}"
            )
    if x.shape[-1] == 0:  # no entries to normalise (amax refuses an empty axis)
        return x.clone() if weight is None else x * weight
    # The root mean square of x / top, times top: x.square() alone overflows (1e30 in
    # float32, 300 in float16) and gave zeros. A zero or non-finite row keeps top = 1.
    top = x.detach().abs().amax(dim=-1, keepdim=True)  # (..., 1)
    top = torch.where(torch.isfinite(top) & (top > 0), top, torch.ones_like(top))
    rms = top * (x / top).square().mean(dim=-1, keepdim=True).sqrt()  # (..., 1)
    normed = x / torch.hypot(rms, rms.new_tensor(eps).sqrt())  # sqrt(rms² + eps)
    return normed if weight is None else normed * weight


def softcap_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    cap: float | None = None,
) -> Tensor:
    r"""Scaled dot-product attention with soft-capped scores (Gemma 2).

    .. math::
        o_i = \sum_j \operatorname{softmax}_j
              \big(c \tanh(q_i \cdot k_j \cdot s / c) + M_{ij}\big) \, v_j

    The cap acts on the scaled scores, before the mask, as in Gemma 2. ``cap=None`` is
    plain attention.

    Args:
        query: ``(..., h, i, d)``.
        key: ``(..., h_kv, j, d)``.
        value: ``(..., h_kv, j, e)``.
        attn_mask: boolean (**True = may attend**) or float (added to the capped
            scores), broadcastable to ``(..., h, i, j)``.
        is_causal: top-left causal mask; not together with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: ``h`` a multiple of ``h_kv``; query head ``n`` reads key/value head
            ``n // (h / h_kv)``.
        cap: :math:`c > 0`, or None for no capping.

    Returns:
        ``(..., h, i, e)``; a query with no visible key gets zeros.

    Example:
        >>> # scores +-100
        >>> q, k = torch.tensor([[10.0]]), torch.tensor([[10.0], [-10.0]])
        >>> v = torch.tensor([[1.0], [0.0]])
        >>> out = softcap_attention(q, k, v, scale=1.0, cap=1.0)
        >>> round(out.item(), 4)  # sigmoid(2)
        0.8808
    """
    validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    if cap is not None:
        cap = check_positive("cap", cap)
    scores, attn_mask = attention_scores(
        query, key, attn_mask, is_causal, scale, enable_gqa
    )  # (..., h, i, j)
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)  # the score_mod: a soft cap
    if enable_gqa:
        value = expand_kv_heads(value, query.shape[-3])  # (..., h, j, e)
    return masked_softmax(scores, attn_mask) @ value  # (..., h, i, e)
