"""Window bounds and block-layout checks shared by the mask builders and the sparse
kernels.

Used by :mod:`attention.efficient.patterns` (which builds the masks) and
:mod:`attention.efficient.sparse` (which computes only the blocks and bands they keep).
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from .._checks import check_size, check_tensor


def window_bounds(window, i: int, j: int) -> tuple[int, int]:
    """``(left, right)`` from ``window`` (an int ``w`` or a pair), clamped to
    ``max(i, j)``.

    A bound beyond ``max(i, j)`` keeps every key on that side, so clamping changes
    nothing and keeps every size linear in the sequence (``None`` = unbounded).
    """
    if isinstance(window, numbers.Integral) and not isinstance(window, bool):
        sides = (window, window)
    elif isinstance(window, tuple | list) and len(window) == 2:
        sides = tuple(window)
    else:
        raise TypeError(
            "window must be an int w (keys with |p - k| <= w) or "
            f"a pair (left, right) of ints or None, got {window!r}"
        )
    limit = max(i, j)
    left, right = (
        limit
        if side is None
        else min(check_size(f"window {name}", side, minimum=0), limit)
        for name, side in zip(("left", "right"), sides, strict=True)
    )
    return left, right


def causal_bounds(
    left: int, right: int, is_causal: bool, i: int, j: int
) -> tuple[int, int]:
    """Apply ``is_causal`` (no key after the query) to the window bounds."""
    if not is_causal:
        return left, right
    if i != j:
        raise ValueError(
            f"is_causal=True needs as many queries as keys here, got i={i} and j={j}; "
            "for local attention over a cache "
            "(queries aligned bottom-right) pass window=(left, 0)"
        )
    return left, 0


def check_layout(layout) -> None:
    check_tensor("layout", layout)
    if layout.dtype != torch.bool:
        raise TypeError(
            f"layout must be boolean (True = block computed), got {layout.dtype}"
        )
    if layout.dim() != 2:
        raise ValueError(
            "layout must be a 2-D (query blocks, key blocks) matrix, "
            f"got shape {tuple(layout.shape)}"
        )


def check_layout_fits(layout: Tensor, block_size: int, i: int, j: int) -> None:
    """The layout must have exactly ``ceil(i / B)`` rows and ``ceil(j / B)`` columns."""
    for name, length, blocks in (
        ("query", i, layout.shape[0]),
        ("key", j, layout.shape[1]),
    ):
        if -(-length // block_size) != blocks:
            raise ValueError(
                f"layout has {blocks} {name} blocks but {length} {name} positions with "
                f"block_size {block_size} need ceil({length}/{block_size}) = "
                f"{-(-length // block_size)}"
            )
