"""Boundary checks shared by every public function of the package.

Each helper raises a ``TypeError`` (wrong kind of object or dtype) or ``ValueError``
(wrong shape, device or value) whose message states the rule and the values seen, so a
reader gets one clear sentence instead of a stack trace from deep inside ``torch``.

A public function validates its arguments once, at the top, with these helpers (or with
:func:`validate_attention`, which bundles the checks every attention kernel needs) and
then calls a private core that does not check again. The computational helpers that
every kernel shares (the masked softmax, the grouped-query head expansion, the default
scale) live in ``_core.py``.

Shape legend: ``b`` batch (any number of leading dims ``...``), ``h`` query heads,
``h_kv`` key/value heads, ``i`` query positions, ``j`` key positions, ``d`` query/key
size, ``e`` value size.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Literal, overload

import torch
from torch import Tensor

# --------------------------------------------------------------------------- scalars


def check_bool(name: str, value) -> bool:
    """Require a real ``bool`` (``'no'``, ``0`` or ``None`` are refused, not
    coerced)."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{name} must be a bool (True or False), "
            f"got {type(value).__name__} {value!r}"
        )
    return value


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """Require a plain integer (not bool), optionally ``>= minimum``; returns it as
    ``int``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_size(name: str, value, *, minimum: int = 1) -> int:
    """A size parameter (block, chunk, window ...): an int ``>= minimum``.

    Clamping a size larger than the sequence to the sequence length is the caller's job,
    since only the caller knows which length bounds it.
    """
    return check_int(name, value, minimum=minimum)


def check_sizes(*, zero_ok: tuple[str, ...] = (), **sizes) -> tuple[int, ...]:
    """Several sizes at once, checked in the order given: ints ``>= 1`` (``>= 0`` for
    the names in ``zero_ok``).
    ``self.d_q, self.d_k = check_sizes(d_q=d_q, d_k=d_k)``."""
    return tuple(
        check_size(name, value, minimum=0 if name in zero_ok else 1)
        for name, value in sizes.items()
    )


@overload
def check_real(name: str, value, *, allow_none: Literal[False] = False) -> float: ...


@overload
def check_real(name: str, value, *, allow_none: bool) -> float | None: ...


def check_real(name: str, value, *, allow_none: bool = False) -> float | None:
    """Require a real number (int or float, not bool, not a tensor); NaN and inf pass.

    An int too large for a float (``10**400``) is a ``ValueError``, not Python's
    ``OverflowError`` from ``float()``.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        wanted = "a float or None" if allow_none else "a float"
        raise TypeError(
            f"{name} must be {wanted}, got {type(value).__name__} {value!r}"
        )
    try:
        return float(value)
    except OverflowError:  # an int (or Fraction) beyond the largest float, 1.8e308
        power = int(math.log10(abs(math.trunc(value))))  # math.log10 takes any int
        raise ValueError(
            f"{name} must be a number a float can hold (magnitude at most "
            f"{sys.float_info.max:.4g}), got {type(value).__name__} of about 1e{power}"
        ) from None


def check_positive(name: str, value) -> float:
    """A finite real number ``> 0`` (a base, a cap)."""
    value = check_real(name, value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return value


def check_scale(scale) -> float | None:
    """``scale`` is None (meaning ``1/sqrt(d)``) or a real number.

    ``scale=True`` is a ``TypeError``; a NaN or infinite scale is allowed and propagates
    into the output, as in ``torch.nn.functional.scaled_dot_product_attention``.
    """
    return check_real("scale", scale, allow_none=True)


def check_probability(name: str, value, *, closed: bool = False) -> float:
    """A probability in ``[0, 1)`` (``[0, 1]`` with ``closed=True``), e.g.
    ``dropout_p``."""
    p = check_real(name, value)
    if not (0.0 <= p <= 1.0 if closed else 0.0 <= p < 1.0):
        raise ValueError(
            f"{name} must lie in [0, 1{']' if closed else ')'}, got {value}"
        )
    return p


def check_choice(name: str, value, choices: tuple) -> object:
    """Require ``value`` to be one of ``choices`` (compared with ``==``, types
    checked)."""
    if not any(type(value) is type(c) and value == c for c in choices):
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_dim(name: str, dim, ndim: int) -> int:
    """A dimension index valid for a tensor with ``ndim`` dims; returns it
    non-negative."""
    dim = check_int(name, dim)
    lo, hi = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    if not lo <= dim <= hi:
        raise ValueError(
            f"{name} must lie in [{lo}, {hi}] for a "
            f"tensor with {ndim} dimensions, got {dim}"
        )
    return dim % max(ndim, 1)


def check_dtype(name: str, dtype, *, floating: bool = False) -> torch.dtype:
    """Require a ``torch.dtype`` (floating-point if asked)."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(
            f"{name} must be a torch.dtype, got {type(dtype).__name__} {dtype!r}"
        )
    if floating and not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point dtype, got {dtype}")
    return dtype


def check_device(name: str, device) -> torch.device | None:
    """``None``, a ``torch.device``, or a string/int torch understands as one."""
    if device is None:
        return None
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(
            f"{name} must be a torch.device, a string such as 'cpu', or None, "
            f"got {type(device).__name__} {device!r}"
        )
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(f"{name} is not a valid device: {device!r} ({err})") from None


def check_factory(device, dtype) -> dict:
    """A module's ``device`` and ``dtype`` arguments, checked, as keyword arguments for
    the ``torch`` factories: ``nn.Linear(d, e, **check_factory(device, dtype))``.

    ``device`` as in :func:`check_device`; ``dtype`` is None (torch's default) or a
    floating-point ``torch.dtype``.
    """
    device = check_device("device", device)
    dtype = None if dtype is None else check_dtype("dtype", dtype, floating=True)
    return {"device": device, "dtype": dtype}


def check_generator(
    generator, device: torch.device | None = None
) -> torch.Generator | None:
    """``None`` or a ``torch.Generator`` (on ``device``'s type, when given)."""
    if generator is None:
        return None
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            "generator must be a torch.Generator or None, "
            f"got {type(generator).__name__}"
        )
    if device is not None and generator.device.type != torch.device(device).type:
        raise ValueError(
            f"generator and tensors must be on the same device type, got "
            f"{generator.device} and {device}"
        )
    return generator


# --------------------------------------------------------------------------- tensors


def check_tensor(
    name: str,
    x,
    *,
    floating: bool = False,
    min_dim: int = 0,
    dtype: torch.dtype | None = None,
) -> None:
    """Require ``x`` to be a Tensor (floating-point if asked, of ``dtype`` if given)
    with at least ``min_dim`` dims."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must have a floating-point dtype, got {x.dtype}")
    if dtype is not None and x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimensions, "
            f"got shape {tuple(x.shape)}"
        )


def check_has_data(name: str, x: Tensor) -> None:
    """``x`` holds values (not a ``meta`` tensor), for checks that must read them."""
    if x.device.type == "meta":
        raise ValueError(
            f"{name} must hold values to be checked, got a tensor on the meta device"
        )


def check_same_device(**tensors: Tensor | None) -> None:
    """Every given tensor lives on one device (``None`` entries are skipped).

    ``check_same_device(query=q, key=k)`` raises ``ValueError`` naming both tensors and
    both devices, e.g. ``query and key must be on the same device, got cpu and meta``.
    """
    present = [(n, t) for n, t in tensors.items() if t is not None]
    for name, t in present[1:]:
        first, t0 = present[0]
        if t.device != t0.device:
            raise ValueError(
                f"{first} and {name} must be on the same device, "
                f"got {t0.device} and {t.device}"
            )


def check_same_dtype(**tensors: Tensor | None) -> None:
    """Every given tensor has one dtype (``None`` entries are skipped)."""
    present = [(n, t) for n, t in tensors.items() if t is not None]
    for name, t in present[1:]:
        first, t0 = present[0]
        if t.dtype != t0.dtype:
            raise TypeError(
                f"{first} and {name} must share a dtype, got {t0.dtype} and {t.dtype}"
            )


def check_like(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """``x`` has the dtype and device of ``ref`` (e.g. an input and a module's weight).

    A float64 input to a float32 module is a ``TypeError`` that says how to convert; a
    different device is a ``ValueError`` naming both devices.
    """
    if x.dtype != ref.dtype:
        raise TypeError(
            f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {x.dtype} "
            "(convert one of them with .to(dtype))"
        )
    if x.device != ref.device:
        raise ValueError(
            f"{name} and {ref_name} must be on the same device, "
            f"got {x.device} and {ref.device}"
        )


def check_qk(query, key, *, same_size: bool = True) -> None:
    """query ``(..., i, d)`` and key ``(..., j, d)``: floating tensors with at least 2
    dims, one dtype, one device, and (with ``same_size``) a shared last dimension
    ``d``."""
    check_tensor("query", query, floating=True, min_dim=2)
    check_tensor("key", key, floating=True, min_dim=2)
    check_same_dtype(query=query, key=key)
    check_same_device(query=query, key=key)
    if same_size and query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "query and key must share their last dimension d, "
            f"got {query.shape[-1]} and {key.shape[-1]}"
        )


def check_qkv(query, key, value=None) -> None:
    """The checks every attention function opens with.

    query ``(..., i, d)``, key ``(..., j, d)`` and value ``(..., j, e)`` must be
    floating tensors of one dtype, on one device, with at least 2 dims; query and key
    share ``d``, key and value share ``j``. ``value=None`` skips the value (for
    functions that take none; a kernel whose caller must pass a value uses
    :func:`validate_attention`, which refuses None). Batch dims are left to the caller
    (their rules differ).
    """
    check_qk(query, key)
    if value is None:
        return
    check_tensor("value", value, floating=True, min_dim=2)
    check_same_dtype(query=query, value=value)
    check_same_device(query=query, value=value)
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            "key and value must have the same number of positions j, "
            f"got {key.shape[-2]} and {value.shape[-2]}"
        )


def check_value(
    value, j: int, like_name: str, like: Tensor, *, min_dim: int = 2
) -> None:
    """value ``(..., j, e)``: a floating tensor with one row per key, in the dtype and
    on the device of ``like`` (the query, the weights ...); ``value=None`` is a
    ``TypeError``."""
    check_tensor("value", value, floating=True, min_dim=min_dim)
    check_like("value", value, like_name, like)
    if value.shape[-2] != j:
        raise ValueError(
            f"value must have one row per key position: j = {j}, "
            f"got {value.shape[-2]} rows"
        )


def check_initial_state(initial_state, shape: tuple[int, ...], like: Tensor) -> None:
    """The starting state of a recurrent kernel (the delta rules, KDA, Lightning).

    ``None`` (a zero state) or a floating tensor with the dtype and device of ``like``
    (the query) and exactly the ``(..., d, e)`` shape ``shape`` the kernel keeps. One
    helper, so every kernel of the recurrent family words these errors alike.
    """
    if initial_state is None:
        return
    check_tensor("initial_state", initial_state, floating=True, min_dim=2)
    check_same_dtype(query=like, initial_state=initial_state)
    check_same_device(query=like, initial_state=initial_state)
    if tuple(initial_state.shape) != tuple(shape):
        raise ValueError(
            f"initial_state must have shape (..., d, e) = {tuple(shape)}, got "
            f"{tuple(initial_state.shape)}"
        )


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """NumPy broadcasting of shapes, or None when they do not broadcast.

    Written out because ``torch.broadcast_shapes`` imports sympy on first use (about
    2 s, paid by every notebook kernel).
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
    """Broadcast ``shapes`` with an error message that names what failed to
    broadcast."""
    out = _broadcast(*(tuple(s) for s in shapes))
    if out is None:
        listed = " and ".join(str(tuple(s)) for s in shapes)
        raise ValueError(f"{what} must broadcast against each other, got {listed}")
    return torch.Size(out)


def check_mask(
    attn_mask, query_dtype: torch.dtype, target: tuple[int, ...], *, device=None
) -> None:
    """Require a boolean or floating mask that broadcasts to ``target`` =
    ``(..., i, j)``.

    A float mask must have the query's dtype or be float32 (what torch's SDPA accepts;
    it is added to the scores in their dtype); with ``device`` given, the mask must live
    there (``ValueError`` naming both devices).
    """
    if not isinstance(attn_mask, Tensor):
        raise TypeError(
            f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}"
        )
    if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
        raise TypeError(
            "attn_mask must be boolean (True = may attend) or "
            f"floating (added to the scores), got {attn_mask.dtype}"
        )
    if attn_mask.is_floating_point() and attn_mask.dtype not in (
        query_dtype,
        torch.float32,
    ):
        raise TypeError(
            "a float attn_mask must have the query's dtype "
            f"{query_dtype} (or float32), got {attn_mask.dtype}"
        )
    if device is not None and attn_mask.device != torch.device(device):
        raise ValueError(
            "query and attn_mask must be on the same device, "
            f"got {device} and {attn_mask.device}"
        )
    if _broadcast(tuple(attn_mask.shape), tuple(target)) != tuple(target):
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the "
            f"(..., i, j) scores of shape {tuple(target)}"
        )


def check_mask_or_causal(attn_mask, is_causal) -> bool:
    """``is_causal`` is a bool, and not True together with an ``attn_mask`` (torch's
    rule)."""
    check_bool("is_causal", is_causal)
    if is_causal and attn_mask is not None:
        raise ValueError(
            "pass either attn_mask or is_causal=True, not both (fold the causal "
            "pattern into the mask with combine_masks)"
        )
    return is_causal


# --------------------------------------------------------------------------- attention


def _heads(query: Tensor, key: Tensor, value: Tensor | None, enable_gqa: bool):
    """Batch dims of query, key, value (heads split off with ``enable_gqa``) and the
    heads."""
    q_batch, k_batch = tuple(query.shape[:-2]), tuple(key.shape[:-2])
    v_batch = tuple(value.shape[:-2]) if value is not None else k_batch
    if not enable_gqa:
        if query.dim() >= 4 and key.dim() >= 4:  # (b, h, i, d): name the heads axis
            hq, hk = query.shape[-3], key.shape[-3]
            if hq != hk and 1 not in (hq, hk):
                raise ValueError(
                    f"query has {hq} heads but key has {hk}; they must match "
                    "(or pass enable_gqa=True for grouped-query attention)"
                )
        return q_batch, k_batch, v_batch, ()
    if query.dim() < 3 or key.dim() < 3 or (value is not None and value.dim() < 3):
        raise ValueError(
            "enable_gqa=True needs a heads axis: query, key and value of shape "
            f"(..., h, i, d), got {tuple(query.shape)} and {tuple(key.shape)}"
        )
    hq, hk = query.shape[-3], key.shape[-3]
    hv = value.shape[-3] if value is not None else hk
    if hk != hv:
        raise ValueError(
            f"key and value must have the same number of heads, got {hk} and {hv}"
        )
    if hk == 0 or hq % hk != 0:
        raise ValueError(
            "with enable_gqa=True the query heads must be a multiple of the key/value "
            f"heads, got {hq} query heads and {hk} key/value heads"
        )
    return q_batch[:-1], k_batch[:-1], v_batch[:-1], (hq,)


def _validate(
    query, key, value, attn_mask, is_causal, scale, enable_gqa, *, needs_value
):
    if needs_value:
        check_tensor("value", value, floating=True, min_dim=2)
    check_qkv(query, key, value)
    check_mask_or_causal(attn_mask, is_causal)
    check_scale(scale)
    check_bool("enable_gqa", enable_gqa)
    q_batch, k_batch, v_batch, heads = _heads(query, key, value, enable_gqa)
    batch = broadcast_shapes(
        "the batch dims of query, key and value", q_batch, k_batch, v_batch
    )
    scores_shape = torch.Size((*batch, *heads, query.shape[-2], key.shape[-2]))
    if attn_mask is not None:
        check_mask(attn_mask, query.dtype, scores_shape, device=query.device)
    return scores_shape


def validate_attention(
    query, key, value, attn_mask=None, is_causal=False, scale=None, enable_gqa=False
) -> torch.Size:
    """All boundary checks of an attention kernel; returns the scores' shape
    ``(..., h, i, j)``.

    Checks, in order: query/key/value are floating tensors of one dtype and device with
    matching ``d`` and ``j`` (:func:`check_qkv`); ``is_causal`` is a bool and not given
    with ``attn_mask``; ``scale`` is None or real; ``enable_gqa`` is a bool and, when
    True, the query heads ``h`` (axis -3) are a multiple of the key/value heads
    ``h_kv``; the batch dims broadcast; ``attn_mask`` (bool or float of the query's
    dtype, on its device) broadcasts to the scores. The output of the kernel has shape
    ``(*scores_shape[:-1], e)``.
    """
    return _validate(
        query, key, value, attn_mask, is_causal, scale, enable_gqa, needs_value=True
    )


def validate_weights(
    query, key, attn_mask=None, is_causal=False, scale=None, enable_gqa=False
) -> torch.Size:
    """:func:`validate_attention` without a value (for functions that return the
    weights)."""
    return _validate(
        query, key, None, attn_mask, is_causal, scale, enable_gqa, needs_value=False
    )
