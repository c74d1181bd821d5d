"""TEMPORARY stand-in for the shared checks refA is adding to _checks.py (to be removed)."""

from __future__ import annotations

import math
import numbers

from torch import Tensor

from ._checks import broadcast_shapes, check_mask, check_qkv


def check_flag(name, flag) -> bool:
    if not isinstance(flag, bool):
        raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    return flag


def check_scale(scale) -> float | None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    return None if scale is None else float(scale)


def check_devices(**tensors) -> None:
    named = [(n, t) for n, t in tensors.items() if isinstance(t, Tensor)]
    first, t0 = named[0]
    for n, t in named[1:]:
        if t.device != t0.device:
            raise ValueError(f"{first} and {n} must be on one device, got {t0.device} and {t.device}")


def prepare_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    check_qkv(query, key, value)
    check_devices(query=query, key=key, value=value, attn_mask=attn_mask)
    check_flag("is_causal", is_causal)
    check_flag("enable_gqa", enable_gqa)
    if is_causal and attn_mask is not None:
        raise ValueError("pass either attn_mask or is_causal=True, not both")
    scale = check_scale(scale)
    qb, kb, vb = query.shape[:-2], key.shape[:-2], value.shape[:-2]
    heads = ()
    if enable_gqa:
        if query.dim() < 3 or key.dim() < 3 or value.dim() < 3:
            raise ValueError("enable_gqa=True needs a heads axis")
        hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if hk != hv or hk == 0 or hq % hk:
            raise ValueError(f"with enable_gqa=True the query heads must be a multiple of the key/value heads, got {hq} query heads and {hk} key/value heads")
        qb, kb, vb, heads = qb[:-1], kb[:-1], vb[:-1], (hq,)
    batch = broadcast_shapes("the batch dims of query, key and value", qb, kb, vb)
    if attn_mask is not None:
        check_mask(attn_mask, query.dtype, (*batch, *heads, query.shape[-2], key.shape[-2]))
    if enable_gqa:
        g = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(g, dim=-3)
        value = value.repeat_interleave(g, dim=-3)
    full = (*batch, *heads)
    query = query.expand(*full, *query.shape[-2:])
    key = key.expand(*full, *key.shape[-2:])
    value = value.expand(*full, *value.shape[-2:])
    d = query.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d else 1.0
    return query, key, value, scale
