"""The unchecked core of rotary position embeddings, the checks of its options and
:class:`RotaryConfig` (exported by :mod:`attention.layers.positional`).

Shared by :mod:`attention.layers.positional` (``apply_rope``),
:mod:`attention.layers.multihead`, :mod:`attention.practice.latent` and :mod:`attention.layers.dual_chunk`, which
validate once at their boundary and then rotate with :func:`rope_rotate`. Shapes: ``x``
``(..., n, d)`` with ``d`` even, positions broadcastable to ``(..., n)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import overload

import torch
from torch import Tensor

from ._checks import (
    broadcast_shapes,
    check_bool,
    check_dtype,
    check_int,
    check_positive,
    check_same_device,
    check_tensor,
)

_SCALING_TYPES = ("linear", "ntk")


# ------------------------------------------------------------------ boundary checks


def check_feature_size(d, name: str = "d") -> int:
    """The feature size of a rotary or sinusoidal encoding: an even int >= 0."""
    d = check_int(name, d, minimum=0)
    if d % 2:
        raise ValueError(
            f"{name} must be even (features come in sin/cos or rotation pairs), got {d}"
        )
    return d


def check_base(base) -> float:
    return check_positive("base", base)


def check_float_dtype(dtype) -> torch.dtype:
    """None (torch's default dtype) or a floating-point dtype."""
    if dtype is None:
        return torch.get_default_dtype()
    return check_dtype("dtype", dtype, floating=True)


def check_scaling(scaling, d: int | None) -> tuple[str, float] | None:
    """Normalise a ``scaling`` dict to ``(type, factor)``; None stays None."""
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
    unknown = set(scaling) - {"type", "rope_type", "factor"}
    if unknown:
        raise ValueError(
            f"scaling accepts the keys 'type' (or 'rope_type') and 'factor', got {sorted(unknown)}"
        )
    if (
        "type" in scaling
        and "rope_type" in scaling
        and scaling["type"] != scaling["rope_type"]
    ):
        raise ValueError(
            "scaling['type'] and its alias scaling['rope_type'] disagree: "
            f"{scaling['type']!r} and {scaling['rope_type']!r}"
        )
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind not in _SCALING_TYPES:
        raise ValueError(f"scaling type must be one of {_SCALING_TYPES}, got {kind!r}")
    if "factor" not in scaling:
        raise ValueError(f"scaling of type {kind!r} needs a 'factor'")
    factor = check_positive("scaling['factor']", scaling["factor"])
    if kind == "ntk" and d == 2:  # d = None: checked again once the head size is known
        raise ValueError(
            "NTK scaling needs d >= 4: its exponent d / (d - 2) is undefined for d = 2"
        )
    return kind, float(factor)


def check_positions(
    positions, shape: tuple[int, ...], like: Tensor, like_name: str, what: str
) -> Tensor:
    """Integer positions on ``like``'s device that broadcast to ``shape`` (named ``what``)."""
    check_tensor("positions", positions)
    if (
        positions.is_floating_point()
        or positions.is_complex()
        or positions.dtype == torch.bool
    ):
        raise TypeError(
            "positions must be an integer tensor (token indices), got "
            f"{positions.dtype}; to stretch positions use scaling={{'type': 'linear', ...}}"
        )
    check_same_device(positions=positions, **{like_name: like})
    if (
        broadcast_shapes(f"positions and {what}", tuple(positions.shape), shape)
        != shape
    ):
        raise ValueError(
            f"positions of shape {tuple(positions.shape)} must broadcast to {what} = {shape}"
        )
    return positions


# ------------------------------------------------------------------ unchecked cores


def inv_freq(
    d: int, base: float, scaling: tuple[str, float] | None, device=None
) -> Tensor:
    """``(d/2,)`` float64 inverse frequencies ``base^(-2k/d)``, after ``scaling``."""
    if scaling is not None and scaling[0] == "ntk":
        base = base * scaling[1] ** (d / (d - 2))
    exponents = torch.arange(0, d, 2, dtype=torch.float64, device=device) / max(d, 1)
    inv_freq = base**-exponents  # (d/2,)
    if scaling is not None and scaling[0] == "linear":
        inv_freq = inv_freq / scaling[1]
    return inv_freq


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """Rotate each feature pair of ``x`` (..., n, d) by the angles whose cos/sin are (..., n, d/2)."""
    if interleaved:  # pairs (2k, 2k+1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(
            -2
        )
    half = x.shape[-1] // 2  # pairs (k, k + d/2): Hugging Face's rotate_half layout
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)


def rope_rotate(
    x: Tensor,
    positions: Tensor,
    base: float,
    interleaved: bool,
    scaling: tuple[str, float] | None,
) -> Tensor:
    """Unchecked core of :func:`apply_rope`: float64 angles, cos/sin in ``x``'s dtype."""
    angles = positions.to(torch.float64)[..., None] * inv_freq(
        x.shape[-1], base, scaling, x.device
    )
    return _rotate(x, angles.cos().to(x.dtype), angles.sin().to(x.dtype), interleaved)


def rotate(x, positions, base, interleaved, scaling) -> Tensor:
    """:func:`attention.apply_rope`: its checks, then :func:`rope_rotate`."""
    check_tensor("x", x, floating=True, min_dim=2)
    d = check_feature_size(x.shape[-1], "the last dimension d of x")
    base = check_base(base)
    check_bool("interleaved", interleaved)
    scaling = check_scaling(scaling, d)
    if positions is None:
        positions = torch.arange(x.shape[-2], device=x.device)  # (n,)
    else:
        positions = check_positions(
            positions, tuple(x.shape[:-1]), x, "x", "x.shape[:-1]"
        )
    return rope_rotate(x, positions, base, interleaved, scaling)


class _FrozenScaling(Mapping):
    """A read-only, hashable copy of a ``scaling`` dict, so a frozen
    :class:`RotaryConfig` holding one can be hashed (a set member, a dict key, a cache
    key). It reads like the dict it copies and equals it."""

    def __init__(self, scaling: Mapping) -> None:
        self._items = dict(scaling)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self) -> Iterator:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return repr(self._items)


@dataclass(frozen=True)
class RotaryConfig:
    """The options of a rotary position embedding (RoPE), in one object.

    Shared by :class:`~attention.MultiHeadAttention` (``rope=RotaryConfig(...)``),
    :class:`~attention.MultiHeadLatentAttention` and :func:`~attention.dual_chunk_attention`,
    so a new RoPE option is added here once, not as a new flag of every module. Validated
    when built.

    Args:
        base: the base :math:`\\theta` of the frequencies :math:`\\theta^{-2k/d}` (10000 in
            Llama 2, 500000 in Llama 3); finite and > 0.
        interleaved: False pairs feature ``k`` with ``k + d/2`` (Hugging Face's
            ``rotate_half``), True pairs ``(2k, 2k+1)`` (RoFormer, Meta's, DeepSeek's layout).
        scaling: None, ``{"type": "linear", "factor": s}`` or ``{"type": "ntk", "factor": s}``
            (see :func:`attention.rope_frequencies`). Stored as a read-only copy that
            reads and compares like the dict and is hashable, so the config is too.

    Example:
        >>> from attention import RotaryConfig, apply_rope
        >>> rope = RotaryConfig(base=500000.0)
        >>> x = torch.randn(2, 5, 8)
        >>> torch.equal(rope.rotate(x), apply_rope(x, base=500000.0))
        True
    """

    base: float = 10000.0
    interleaved: bool = False
    scaling: Mapping | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", check_base(self.base))
        check_bool("interleaved", self.interleaved)
        check_scaling(self.scaling, None)
        if self.scaling is not None:  # a frozen copy: the config cannot change under us
            object.__setattr__(self, "scaling", _FrozenScaling(self.scaling))

    def rotate(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """:func:`attention.apply_rope` of ``x`` ``(..., n, d)`` with these options."""
        return rotate(x, positions, self.base, self.interleaved, self.scaling)


@overload
def rope_config(rope, *, default: RotaryConfig) -> RotaryConfig: ...


@overload
def rope_config(rope, *, default: None) -> RotaryConfig | None: ...


def rope_config(rope, *, default: RotaryConfig | None) -> RotaryConfig | None:
    """``rope`` checked: a :class:`attention.RotaryConfig`, or None for ``default``.

    The one way to give RoPE options (no separate ``base=`` or ``interleaved=`` flags):
    a module or function that rotates takes ``rope=RotaryConfig(...)``.
    """
    if rope is None:
        return default
    if not isinstance(rope, RotaryConfig):
        raise TypeError(
            f"rope must be a RotaryConfig or None, got {type(rope).__name__} {rope!r} "
            "(pass rope=RotaryConfig(...), e.g. RotaryConfig(base=500000.0))"
        )
    return rope
