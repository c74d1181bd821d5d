"""Mask builders (taught in chapter 4; sparse patterns in chapter 13).

Convention, everywhere in this package: a mask is **boolean and True means "may
attend"**, as in ``torch.nn.functional.scaled_dot_product_attention``. It must broadcast
to the ``(b, h, i, j)`` scores: ``i`` indexes queries (rows), ``j`` keys (columns).
``nn.MultiheadAttention``'s ``attn_mask``/``key_padding_mask`` use the opposite polarity
(True = blocked); invert with ``~mask`` when passing one of ours there.

Shape legend: ``b`` batch, ``h`` heads, ``i`` query positions, ``j`` key positions,
``n`` sequence length when ``i = j``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from .._checks import (
    broadcast_shapes,
    check_bool,
    check_choice,
    check_device,
    check_dtype,
    check_has_data,
    check_int,
    check_same_device,
    check_tensor,
)
from .._core import additive_mask, tril_mask

# The facade re-exports the library names (the first 4); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "causal_mask",
    "padding_mask",
    "block_diagonal_mask",
    "combine_masks",
    "decoding_mask",
    "to_additive_mask",
]


def causal_mask(
    i: int, j: int | None = None, *, align: str = "top-left", device=None
) -> Tensor:
    """Causal (look-ahead) mask of shape ``(i, j)``; True = may attend.

    With ``align="top-left"`` (what ``is_causal=True`` means in PyTorch) query ``q`` may
    see key ``k`` iff ``k <= q``. With ``align="bottom-right"`` the last query is
    aligned with the last key, ``k <= q + (j - i)``: the right mask when ``i`` new
    queries follow ``j - i`` cached positions during incremental decoding (flash-attn's
    ``causal=True`` aligns this way).

    Args:
        i: number of queries.
        j: number of keys (defaults to ``i``).
        align: ``"top-left"`` or ``"bottom-right"``.
        device: where to build the mask.

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
    check_choice("align", align, ("top-left", "bottom-right"))
    device = check_device("device", device)
    offset = 0 if align == "top-left" else j - i
    return tril_mask(i, j, offset=offset, device=device)  # (i, j): k <= q + offset


def decoding_mask(num_new: int, num_cached: int, *, device=None) -> Tensor:
    """Mask for ``num_new`` queries appended after ``num_cached`` cached positions.

    Every new query sees all cached keys plus a causal triangle over the new ones:
    ``(num_new, num_cached + num_new)``, True = may attend. The same as
    ``causal_mask(num_new, num_cached + num_new, align="bottom-right")``, which the
    package uses; this name stays for chapter 4, which builds it step by step.

    Example:
        >>> decoding_mask(2, 1).int().tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    num_new = check_int("num_new", num_new, minimum=0)
    num_cached = check_int("num_cached", num_cached, minimum=0)
    return causal_mask(
        num_new, num_cached + num_new, align="bottom-right", device=device
    )


def _lengths(lengths, device) -> Tensor:
    """``lengths`` as a 1-D LongTensor of non-negative integers (floats are refused)."""
    device = check_device("device", device)
    if isinstance(lengths, Tensor):
        if (
            lengths.is_floating_point()
            or lengths.is_complex()
            or lengths.dtype == torch.bool
        ):
            raise TypeError(
                f"lengths must be an integer tensor, got dtype {lengths.dtype}"
            )
        if lengths.dim() != 1:
            raise ValueError(
                "lengths must be 1-D, one length per sequence, "
                f"got shape {tuple(lengths.shape)}"
            )
        lengths = lengths.to(
            device=device if device is not None else lengths.device, dtype=torch.long
        )
    else:
        try:
            if isinstance(lengths, (str, bytes)):
                raise TypeError
            lengths = list(lengths)  # a list, tuple, range or NumPy array of ints
        except TypeError:
            raise TypeError(
                f"lengths must be a sequence of ints or a 1-D integer tensor, "
                f"got {type(lengths).__name__}"
            ) from None
        for n in lengths:
            if isinstance(n, bool) or not isinstance(n, numbers.Integral):
                raise TypeError(f"lengths must hold ints, got {type(n).__name__} {n!r}")
        lengths = torch.tensor(
            [int(n) for n in lengths], dtype=torch.long, device=device
        )
    check_has_data("lengths", lengths)
    if lengths.numel() and lengths.min() < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    return lengths


def padding_mask(
    lengths: Tensor | Sequence[int], j: int, *, side: str = "right", device=None
) -> Tensor:
    """Key-padding mask of shape ``(b, 1, 1, j)``; True = a real token that may be
    attended.

    Sequence ``n`` of the batch holds ``lengths[n]`` real tokens. With ``side="right"``
    the padding follows them (real tokens at positions ``0 ... lengths[n] - 1``); with
    ``side="left"`` it precedes them (real tokens at ``j - lengths[n] ... j - 1``), the
    layout decoder-only models use for batched generation, so that every sequence ends
    at the last position. The two singleton axes broadcast over heads and queries.

    Args:
        lengths: ``(b,)`` integers in ``[0, j]`` (a list of ints or an integer tensor;
            floats are refused rather than truncated).
        j: padded key length.
        side: ``"right"`` or ``"left"``, where the padding sits.
        device: where to build the mask (default: that of ``lengths``).

    Returns:
        ``(b, 1, 1, j)`` boolean tensor.

    Example:
        >>> padding_mask([2, 3], 3)[:, 0, 0].int().tolist()
        [[1, 1, 0], [1, 1, 1]]
        >>> padding_mask([2, 3], 3, side="left")[:, 0, 0].int().tolist()
        [[0, 1, 1], [1, 1, 1]]
    """
    j = check_int("j", j, minimum=0)
    check_choice("side", side, ("right", "left"))
    lengths = _lengths(lengths, device)
    if lengths.numel() and lengths.max() > j:
        raise ValueError(f"lengths must lie in [0, j={j}], got {lengths.tolist()}")
    positions = torch.arange(j, device=lengths.device)  # (j,)
    if side == "left":
        keep = positions >= j - lengths.unsqueeze(-1)  # (b, j)
    else:
        keep = positions < lengths.unsqueeze(-1)  # (b, j)
    return keep[:, None, None, :]  # (b, 1, 1, j)


def block_diagonal_mask(
    lengths: Tensor | Sequence[int], *, is_causal: bool = False, device=None
) -> Tensor:
    """Mask for packed sequences ("document masking"), shape ``(n, n)`` with
    ``n = sum(lengths)``.

    Several sequences of unequal length are concatenated into one row of ``n`` tokens
    instead of being padded to a common length; a token may attend only to the tokens of
    its own sequence, so the mask is block-diagonal, one ``(l, l)`` block of True per
    sequence. With ``is_causal`` each block is also lower-triangular (packed training of
    a decoder). Attention under this mask equals attention run on each sequence apart;
    what the packing saves is the padding. (flash-attn's ``flash_attn_varlen_func`` with
    ``cu_seqlens`` and xFormers' ``BlockDiagonalMask.from_seqlens`` express the same.)

    Args:
        lengths: the lengths of the packed sequences, integers ``>= 0``.
        is_causal: also hide keys after the query inside each sequence.
        device: where to build the mask (default: that of ``lengths``).

    Returns:
        ``(n, n)`` boolean tensor, True = may attend.

    Example:
        >>> block_diagonal_mask([2, 1]).int().tolist()
        [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    """
    check_bool("is_causal", is_causal)
    lengths = _lengths(lengths, device)
    segment = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device), lengths
    )  # (n,): which sequence each packed token belongs to
    mask = segment.unsqueeze(-1) == segment.unsqueeze(0)  # (n, n)
    if is_causal:
        mask = mask & tril_mask(*mask.shape, device=mask.device)
    return mask


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
            raise TypeError(
                f"combine_masks takes boolean masks (True = may attend), got {m.dtype}"
            )
    if not present:
        return None
    check_same_device(**{f"mask {n}": m for n, m in enumerate(present)})
    broadcast_shapes("masks", *(tuple(m.shape) for m in present))
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def to_additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Turn a boolean mask (True = may attend) into an additive one: 0 where allowed,
    -inf where not.

    Adding the result to the scores before the softmax is equivalent to masking, and
    ``exp(-inf) = 0`` exactly. (A finite stand-in such as -1e9 leaks a tiny weight and
    overflows in float16; chapter 4 shows both.)

    Example:
        >>> to_additive_mask(torch.tensor([True, False])).tolist()
        [0.0, -inf]
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
    check_dtype("dtype", dtype, floating=True)
    return additive_mask(mask, dtype)  # 0 where True, -inf where False
