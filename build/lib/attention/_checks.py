"""Boundary checks shared by the public functions.

Each helper raises a ``TypeError`` (wrong kind of object or dtype) or ``ValueError``
(wrong shape or value) whose message states the rule and the values seen, so a reader
gets one clear sentence instead of a stack trace from deep inside ``torch``.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor


def check_tensor(name: str, x, *, floating: bool = False, min_dim: int = 0) -> None:
    """Require ``x`` to be a Tensor (floating-point if asked) with at least ``min_dim`` dims."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}"
        )


def check_qkv(query, key, value=None) -> None:
    """The checks every attention function opens with.

    query ``(..., i, d)``, key ``(..., j, d)`` and value ``(..., j, e)`` (value optional) must
    be floating tensors of one dtype with at least 2 dims, query and key must share ``d``,
    key and value must share ``j``. Batch dims are left to the caller (their rules differ).
    """
    check_tensor("query", query, floating=True, min_dim=2)
    check_tensor("key", key, floating=True, min_dim=2)
    if value is not None:
        check_tensor("value", value, floating=True, min_dim=2)
    for name, t in (("key", key), ("value", value)):
        if t is not None and t.dtype != query.dtype:
            raise TypeError(f"query and {name} must share a dtype, got {query.dtype} and {t.dtype}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "query and key must share their last dimension d, "
            f"got {query.shape[-1]} and {key.shape[-1]}"
        )
    if value is not None and key.shape[-2] != value.shape[-2]:
        raise ValueError(
            "key and value must have the same number of positions j, "
            f"got {key.shape[-2]} and {value.shape[-2]}"
        )


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """Require a plain integer (not bool), optionally ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """NumPy broadcasting of shapes, or None when they do not broadcast.

    Written out because ``torch.broadcast_shapes`` imports sympy on first use (about 2 s,
    paid by every notebook kernel).
    """
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(-ndim, 0):
        sizes = {s[axis] for s in shapes if len(s) >= -axis} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def broadcast_shapes(what: str, *shapes: tuple[int, ...]) -> torch.Size:
    """Broadcast ``shapes`` with an error message that names what failed to broadcast."""
    out = _broadcast(*(tuple(s) for s in shapes))
    if out is None:
        listed = " and ".join(str(tuple(s)) for s in shapes)
        raise ValueError(f"{what} must broadcast against each other, got {listed}")
    return torch.Size(out)


def check_mask(attn_mask, query_dtype: torch.dtype, target: tuple[int, ...]) -> None:
    """Require a boolean or floating mask that broadcasts to ``target`` = ``(..., i, j)``."""
    if not isinstance(attn_mask, Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(
            "attn_mask must be boolean (True = may attend) or floating (added to the scores), "
            f"got {attn_mask.dtype}"
        )
    if attn_mask.is_floating_point() and attn_mask.dtype != query_dtype:
        raise TypeError(
            f"a float attn_mask must have the query's dtype {query_dtype}, got {attn_mask.dtype}"
        )
    if _broadcast(tuple(attn_mask.shape), tuple(target)) != tuple(target):
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the "
            f"(..., i, j) scores of shape {tuple(target)}"
        )
