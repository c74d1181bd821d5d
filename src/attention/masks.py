"""Mask builders (taught in chapter 04; sparse patterns in chapter 11).

Convention, everywhere in this package: a mask is **boolean and True means "may attend"**,
as in ``torch.nn.functional.scaled_dot_product_attention``. It must broadcast to the
``(b, h, i, j)`` scores: ``i`` indexes queries (rows), ``j`` keys (columns).
``nn.MultiheadAttention``'s ``attn_mask``/``key_padding_mask`` use the opposite polarity
(True = blocked); invert with ``~mask`` when passing one of ours there.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._checks import broadcast_shapes, check_int, check_tensor

__all__ = [
    "causal_mask",
    "padding_mask",
    "decoding_mask",
    "combine_masks",
    "to_additive_mask",
]


def causal_mask(
    i: int, j: int | None = None, *, align: str = "top-left", device=None
) -> Tensor:
    """Causal (look-ahead) mask of shape ``(i, j)``; True = may attend.

    With ``align="top-left"`` (what ``is_causal=True`` means in PyTorch) query ``q`` may
    see key ``k`` iff ``k <= q``. With ``align="bottom-right"`` the last query is aligned
    with the last key, ``k <= q + (j - i)``: the right mask when ``i`` new queries follow
    ``j - i`` cached positions during incremental decoding.

    Args:
        i: number of queries.
        j: number of keys (defaults to ``i``).
        align: ``"top-left"`` or ``"bottom-right"``.

    Returns:
        ``(i, j)`` boolean tensor.

    Example:
        >>> causal_mask(2, 3).int().tolist()
        [[1, 0, 0], [1, 1, 0]]
        >>> causal_mask(2, 3, align="bottom-right").int().tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    i = check_int("i", i, minimum=0)
    j = i if j is None else check_int("j", j, minimum=0)
    if align not in ("top-left", "bottom-right"):
        raise ValueError(f"align must be 'top-left' or 'bottom-right', got {align!r}")
    offset = 0 if align == "top-left" else j - i
    q = torch.arange(i, device=device).unsqueeze(-1)  # (i, 1)
    k = torch.arange(j, device=device).unsqueeze(0)  # (1, j)
    return k <= q + offset  # (i, j)


def decoding_mask(num_new: int, num_cached: int, *, device=None) -> Tensor:
    """Mask for ``num_new`` queries appended after ``num_cached`` cached positions.

    Every new query sees all cached keys (a block of True) plus a causal triangle over
    the new ones: ``(num_new, num_cached + num_new)``, True = may attend. Equal to
    ``causal_mask(num_new, num_cached + num_new, align="bottom-right")``.
    """
    num_new = check_int("num_new", num_new, minimum=0)
    num_cached = check_int("num_cached", num_cached, minimum=0)
    cached = torch.ones(num_new, num_cached, dtype=torch.bool, device=device)
    return torch.cat([cached, causal_mask(num_new, device=device)], dim=-1)


def padding_mask(lengths: Tensor | Sequence[int], j: int, *, device=None) -> Tensor:
    """Key-padding mask of shape ``(b, 1, 1, j)``; True = a real token that may be attended.

    Sequence ``n`` of the batch has ``lengths[n]`` real tokens followed by padding. The
    two singleton axes broadcast over heads and query positions.

    Args:
        lengths: ``(b,)`` integers in ``[0, j]``.
        j: padded key length.

    Returns:
        ``(b, 1, 1, j)`` boolean tensor.

    Example:
        >>> padding_mask([2, 3], 3)[:, 0, 0].int().tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    j = check_int("j", j, minimum=0)
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(list(lengths), dtype=torch.long, device=device)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(
            f"lengths must be a 1-D integer sequence, got dtype {lengths.dtype} "
            f"and shape {tuple(lengths.shape)}"
        )
    if lengths.numel() and (lengths.min() < 0 or lengths.max() > j):
        raise ValueError(
            f"lengths must lie in [0, j={j}], got min {int(lengths.min())} "
            f"and max {int(lengths.max())}"
        )
    positions = torch.arange(j, device=lengths.device)  # (j,)
    return (positions < lengths.unsqueeze(-1))[:, None, None, :]  # (b, 1, 1, j)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks after broadcasting; ``None`` entries are skipped.

    A position may be attended only if every mask allows it. Returns ``None`` when all
    inputs are ``None`` (no masking).

    Example:
        >>> m = combine_masks(causal_mask(3), padding_mask([2], 3))
        >>> m.shape, m[0, 0].int().tolist()
        (torch.Size([1, 1, 3, 3]), [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    """
    present = [m for m in masks if m is not None]
    for n, m in enumerate(present):
        check_tensor(f"mask {n}", m)
        if m.dtype != torch.bool:
            raise TypeError(f"combine_masks takes boolean masks (True = may attend), got {m.dtype}")
    if not present:
        return None
    broadcast_shapes("masks", *(tuple(m.shape) for m in present))
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def to_additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Turn a boolean mask (True = may attend) into an additive one: 0 where allowed, -inf where not.

    Adding the result to the scores before the softmax is equivalent to masking, and
    ``exp(-inf) = 0`` exactly. (A finite stand-in such as -1e9 leaks a tiny weight and
    overflows in float16; chapter 04 shows both.)
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype, got {dtype}")
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))
