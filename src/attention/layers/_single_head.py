"""The checks and the attention step shared by the single-head modules.

:class:`attention.SelfAttention` and :class:`attention.CrossAttention` own their
projections; both check their inputs and attend with these. Shapes: inputs
``(..., n, features)``, projected queries ``(..., i, d)``, keys ``(..., j, d)``, values
``(..., j, e)``.
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import (
    broadcast_shapes,
    check_bool,
    check_like,
    check_mask,
    check_mask_or_causal,
    check_tensor,
)
from .._core import _attention


def _check_features(name: str, x, expected: int, what: str, layer: nn.Linear) -> None:
    """Require a floating tensor ``x`` of shape ``(..., n, expected)`` in ``layer``'s dtype
    and on its device."""
    check_tensor(name, x, floating=True, min_dim=2)
    if x.shape[-1] != expected:
        raise ValueError(
            f"{name} must have {what}={expected} features in its last dimension, "
            f"got {x.shape[-1]} (shape {tuple(x.shape)})"
        )
    check_like(name, x, "the module's parameters", layer.weight)


def _check_options(
    x_query: Tensor, x_context: Tensor, attn_mask, is_causal, need_weights
) -> None:
    """The flags and the mask of a single-head module, against ``(..., i, j)`` scores."""
    check_mask_or_causal(attn_mask, is_causal)
    check_bool("need_weights", need_weights)
    batch = broadcast_shapes(
        "the batch dims of the two inputs", x_query.shape[:-2], x_context.shape[:-2]
    )
    if attn_mask is not None:
        target = (*batch, x_query.shape[-2], x_context.shape[-2])
        check_mask(attn_mask, x_query.dtype, target, device=x_query.device)


def _attend(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask,
    is_causal: bool,
    need_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """Attention on projected ``(..., i, d)``, ``(..., j, d)``, ``(..., j, e)`` (unchecked).

    Returns ``((..., i, e), (..., i, j) or None)``.
    """
    out, weights = _attention(query, key, value, attn_mask, is_causal, None, False)
    return out, (weights if need_weights else None)
