"""The checks shared by the single-head modules.

:class:`attention.SelfAttention` and :class:`attention.CrossAttention` own their
projections; both check their inputs with these, then attend with
:func:`attention.attention_weights`. Shapes: inputs ``(..., n, features)``.
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


def check_features(name: str, x, expected: int, what: str, layer: nn.Linear) -> None:
    """Require a floating tensor ``x`` of shape ``(..., n, expected)`` in ``layer``'s
    dtype and on its device."""
    check_tensor(name, x, floating=True, min_dim=2)
    if x.shape[-1] != expected:
        raise ValueError(
            f"{name} must have {what}={expected} features in its last dimension, "
            f"got {x.shape[-1]} (shape {tuple(x.shape)})"
        )
    check_like(name, x, "the module's parameters", layer.weight)


def check_options(
    x_query: Tensor, x_context: Tensor, attn_mask, is_causal, need_weights
) -> None:
    """The flags and the mask of a single-head module, against ``(..., i, j)``
    scores."""
    check_mask_or_causal(attn_mask, is_causal)
    check_bool("need_weights", need_weights)
    batch = broadcast_shapes(
        "the batch dims of the two inputs", x_query.shape[:-2], x_context.shape[:-2]
    )
    if attn_mask is not None:
        target = (*batch, x_query.shape[-2], x_context.shape[-2])
        check_mask(attn_mask, x_query.dtype, target, device=x_query.device)
