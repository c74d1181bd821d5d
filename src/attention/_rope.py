"""The unchecked core of rotary position embeddings, the checks of its options and
:class:`RotaryConfig` (exported by :mod:`attention.layers.positional`).

Shared by :mod:`attention.layers.positional` (``apply_rope``),
:mod:`attention.layers.multihead`, :mod:`attention.practice.latent` and
:mod:`attention.layers.dual_chunk`, which validate once at their boundary and then
rotate with :func:`rope_rotate`. Shapes: ``x`` ``(..., n, d)`` with ``d`` even,
positions broadcastable to ``(..., n)``.
"""

from __future__ import annotations

import math
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

_SCALING_TYPES = ("linear", "ntk", "llama3", "yarn")

# the keys a scaling type takes besides 'type' (or 'rope_type') and 'factor', in the
# order of the normalised tuple; a default of _REQUIRED means the key must be given.
# Names and defaults are transformers' (its rope_parameters), so a config's dict fits.
_REQUIRED = object()
_SCALING_KEYS = {
    "linear": {},
    "ntk": {},
    "llama3": {
        "low_freq_factor": _REQUIRED,
        "high_freq_factor": _REQUIRED,
        "original_max_position_embeddings": _REQUIRED,
    },
    "yarn": {
        "original_max_position_embeddings": _REQUIRED,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "attention_factor": None,
        "truncate": True,
    },
}


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


def check_scaling(scaling, d: int | None, base: float | None = None) -> tuple | None:
    """Normalise a ``scaling`` dict to ``(type, factor)`` (linear, ntk) or
    ``(type, factor, options)`` (llama3, yarn: the options of :data:`_SCALING_KEYS` in
    their order, defaults filled in); None stays None. ``d`` and ``base`` (None: not
    known yet) are checked against the type where it matters."""
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise TypeError(f"scaling must be a dict or None, got {type(scaling).__name__}")
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
    options = _SCALING_KEYS[kind]
    unknown = set(scaling) - {"type", "rope_type", "factor", *options}
    if unknown:
        extra = "".join(f", {key!r}" for key in options)
        raise ValueError(
            f"scaling of type {kind!r} accepts the keys 'type' (or 'rope_type'), "
            f"'factor'{extra}; got {sorted(unknown)}"
            + (" (give the base as base=...)" if "rope_theta" in unknown else "")
        )
    if "factor" not in scaling:
        raise ValueError(f"scaling of type {kind!r} needs a 'factor'")
    factor = check_positive("scaling['factor']", scaling["factor"])
    if kind == "ntk" and d == 2:  # d = None: checked again once the head size is known
        raise ValueError(
            "NTK scaling needs d >= 4: its exponent d / (d - 2) is undefined for d = 2"
        )
    if kind == "yarn" and base is not None and base <= 1:
        raise ValueError(
            f"YaRN scaling needs base > 1 (it places pairs by log(base)), got {base}"
        )
    if not options:
        return kind, float(factor)
    missing = [key for key, default in options.items() if default is _REQUIRED]
    missing = [key for key in missing if key not in scaling]
    if missing:
        raise ValueError(
            f"scaling of type {kind!r} needs {', '.join(map(repr, missing))}"
        )
    given = {key: scaling.get(key, default) for key, default in options.items()}
    return kind, float(factor), _check_scaling_options(kind, given)


def _check_scaling_options(kind: str, given: dict) -> tuple:
    """The options of a llama3 or yarn scaling, checked, in _SCALING_KEYS order."""
    original = check_int(
        "scaling['original_max_position_embeddings']",
        given["original_max_position_embeddings"],
        minimum=1,
    )
    if kind == "llama3":
        low = check_positive("scaling['low_freq_factor']", given["low_freq_factor"])
        high = check_positive("scaling['high_freq_factor']", given["high_freq_factor"])
        if high <= low:
            raise ValueError(
                "scaling['high_freq_factor'] must exceed scaling['low_freq_factor'] "
                f"(the smooth band lies between them), got {high} and {low}"
            )
        return low, high, original
    fast = check_positive("scaling['beta_fast']", given["beta_fast"])
    slow = check_positive("scaling['beta_slow']", given["beta_slow"])
    if fast <= slow:
        raise ValueError(
            "scaling['beta_fast'] must exceed scaling['beta_slow'] (turns in the "
            f"original context: fast pairs make more), got {fast} and {slow}"
        )
    attention_factor = given["attention_factor"]
    if attention_factor is not None:
        attention_factor = check_positive(
            "scaling['attention_factor']", attention_factor
        )
    truncate = check_bool("scaling['truncate']", given["truncate"])
    return original, fast, slow, attention_factor, truncate


def check_positions(
    positions, shape: tuple[int, ...], like: Tensor, like_name: str, what: str
) -> Tensor:
    """Integer positions on ``like``'s device that broadcast to ``shape``.

    ``what`` names ``shape`` in the error messages.
    """
    check_tensor("positions", positions)
    if (
        positions.is_floating_point()
        or positions.is_complex()
        or positions.dtype == torch.bool
    ):
        raise TypeError(
            "positions must be an integer tensor (token indices), got "
            f"{positions.dtype}; to stretch positions use "
            "scaling={'type': 'linear', ...}"
        )
    check_same_device(positions=positions, **{like_name: like})
    if (
        broadcast_shapes(f"positions and {what}", tuple(positions.shape), shape)
        != shape
    ):
        raise ValueError(
            f"positions of shape {tuple(positions.shape)} must broadcast to "
            f"{what} = {shape}"
        )
    return positions


# ------------------------------------------------------------------ unchecked cores


def inv_freq(d: int, base: float, scaling: tuple | None, device=None) -> Tensor:
    """``(d/2,)`` float64 inverse frequencies ``base^(-2k/d)``, after ``scaling``."""
    if scaling is not None and scaling[0] == "ntk":
        base = base * scaling[1] ** (d / (d - 2))
    exponents = torch.arange(0, d, 2, dtype=torch.float64, device=device) / max(d, 1)
    inv_freq = base**-exponents  # (d/2,)
    if scaling is not None and scaling[0] == "linear":
        inv_freq = inv_freq / scaling[1]
    if scaling is not None and scaling[0] == "llama3":
        inv_freq = _llama3_inv_freq(inv_freq, scaling[1], *scaling[2])
    if scaling is not None and scaling[0] == "yarn":
        original, fast, slow, _, truncate = scaling[2]
        inv_freq = _yarn_inv_freq(
            inv_freq, d, base, scaling[1], original, fast, slow, truncate
        )
    return inv_freq


def _llama3_inv_freq(
    inv_freq: Tensor, factor: float, low: float, high: float, original: int
) -> Tensor:
    """Llama 3.1's scaling: keep the pairs whose wavelength is under
    ``original / high``, divide those over ``original / low`` by ``factor``, blend
    linearly in between (in ``original / wavelength``, the turns a pair makes in the
    original context)."""
    turns = original * inv_freq / (2 * math.pi)  # (d/2,) turns in `original` positions
    smooth = ((turns - low) / (high - low)).clamp(0.0, 1.0)  # 0: slow pair, 1: fast
    return (1 - smooth) * inv_freq / factor + smooth * inv_freq


def _yarn_inv_freq(
    inv_freq: Tensor,
    d: int,
    base: float,
    factor: float,
    original: int,
    beta_fast: float,
    beta_slow: float,
    truncate: bool,
) -> Tensor:
    """YaRN's "NTK-by-parts" (Peng et al., 2024) as transformers computes it: keep the
    pairs that turn more than ``beta_fast`` times in the original context, divide those
    turning fewer than ``beta_slow`` times by ``factor``, and ramp linearly in the pair
    index in between (the ends rounded outwards to whole pairs when ``truncate``)."""

    def pair_making(turns: float) -> float:
        # the (fractional) pair index k whose period 2 pi base^(2k/d) fits `turns` times
        return d * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_making(beta_fast), pair_making(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:  # transformers' guard against a zero-width ramp
        high += 0.001
    k = torch.arange(len(inv_freq), dtype=torch.float64, device=inv_freq.device)
    ramp = ((k - low) / (high - low)).clamp(0.0, 1.0)  # 0: kept, 1: divided by factor
    return ramp * inv_freq / factor + (1 - ramp) * inv_freq


def _attention_factor(scaling: tuple | None) -> float:
    """YaRN's factor on cos and sin (so ``q . k`` grows by its square): the given
    ``attention_factor``, else ``0.1 ln(factor) + 1`` (1 for a factor <= 1); 1 for every
    other scaling."""
    if scaling is None or scaling[0] != "yarn":
        return 1.0
    factor, attention_factor = scaling[1], scaling[2][3]
    if attention_factor is not None:
        return attention_factor
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """Rotate each feature pair of ``x`` (..., n, d) by the angles.

    ``cos`` and ``sin`` hold the angles' cosines and sines, shape (..., n, d/2).
    """
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
    scaling: tuple | None,
) -> Tensor:
    """Unchecked core of :func:`apply_rope`: float64 angles, cos/sin in ``x``'s dtype
    (times YaRN's attention factor under a yarn scaling, as transformers applies it)."""
    angles = positions.to(torch.float64)[..., None] * inv_freq(
        x.shape[-1], base, scaling, x.device
    )
    cos, sin = angles.cos(), angles.sin()
    factor = _attention_factor(scaling)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor
    return _rotate(x, cos.to(x.dtype), sin.to(x.dtype), interleaved)


def rotate(x, positions, base, interleaved, scaling) -> Tensor:
    """:func:`attention.apply_rope`: its checks, then :func:`rope_rotate`."""
    check_tensor("x", x, floating=True, min_dim=2)
    d = check_feature_size(x.shape[-1], "the last dimension d of x")
    base = check_base(base)
    check_bool("interleaved", interleaved)
    scaling = check_scaling(scaling, d, base)
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
    :class:`~attention.MultiHeadLatentAttention` and
    :func:`~attention.dual_chunk_attention`, so a new RoPE option is added here once,
    not as a new flag of every module. Validated when built.

    Args:
        base: the base :math:`\\theta` of the frequencies :math:`\\theta^{-2k/d}`
            (10000 in Llama 2, 500000 in Llama 3); finite and > 0.
        interleaved: False pairs feature ``k`` with ``k + d/2`` (Hugging Face's
            ``rotate_half``), True pairs ``(2k, 2k+1)`` (RoFormer, Meta's and DeepSeek's
            layout).
        scaling: None or a dict of type ``"linear"``, ``"ntk"``, ``"llama3"`` (Llama
            3.1) or ``"yarn"`` (see :func:`attention.rope_frequencies`); a yarn scaling
            also multiplies cos and sin by :attr:`attention_factor` (as transformers
            does). Stored as a read-only copy that reads and compares like the dict and
            is hashable, so the config is too.

    Example:
        >>> from attention import RotaryConfig, apply_rope
        >>> rope = RotaryConfig(base=500000.0)
        >>> x = torch.randn(2, 5, 8)
        >>> torch.equal(rope.rotate(x), apply_rope(x, base=500000.0))
        True
        >>> yarn = {"type": "yarn", "factor": 4.0,
        ...         "original_max_position_embeddings": 64}
        >>> round(RotaryConfig(scaling=yarn).attention_factor, 4)  # 0.1 ln 4 + 1
        1.1386
    """

    base: float = 10000.0
    interleaved: bool = False
    scaling: Mapping | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", check_base(self.base))
        check_bool("interleaved", self.interleaved)
        check_scaling(self.scaling, None, self.base)
        if self.scaling is not None:  # a frozen copy: the config cannot change under us
            object.__setattr__(self, "scaling", _FrozenScaling(self.scaling))

    def rotate(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """:func:`attention.apply_rope` of ``x`` ``(..., n, d)`` with these options."""
        return rotate(x, positions, self.base, self.interleaved, self.scaling)

    @property
    def attention_factor(self) -> float:
        """What the rotation multiplies cos and sin by: YaRN's ``attention_factor``
        (given, else ``0.1 ln(factor) + 1``), so every score ``q . k`` is multiplied by
        its square; 1.0 for every other scaling (transformers'
        ``attention_scaling``)."""
        return _attention_factor(check_scaling(self.scaling, None, self.base))


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
