"""What the key/value caches share (private): buffer checks, read-outs and update
checks.

:class:`attention.KVCache`, :class:`attention.PagedKVCache`,
:class:`attention.StreamingKVCache` and :class:`attention.LatentKVCache` keep their
positions in preallocated buffers. The rules for building those buffers, the properties
that read them (``dtype``, ``device``, ``nbytes``, ``remaining``) and the checks on new
keys and values are written once here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_device, check_dtype, check_tensor


def buffer_kind(dtype, device) -> tuple[torch.dtype, torch.device | None]:
    """A cache's checked ``(dtype, device)``: a floating dtype (default
    ``torch.get_default_dtype()``) and ``None`` or a device."""
    dtype = (
        torch.get_default_dtype()
        if dtype is None
        else check_dtype("dtype", dtype, floating=True)
    )
    return dtype, check_device("device", device)


def zero_buffers(shape: tuple[int, ...], dtype, device) -> tuple[Tensor, Tensor]:
    """Zero key and value buffers of ``shape``, after :func:`buffer_kind`'s checks."""
    dtype, device = buffer_kind(dtype, device)
    return (
        torch.zeros(shape, dtype=dtype, device=device),
        torch.zeros(shape, dtype=dtype, device=device),
    )


def check_new_kv(
    key, value, layout: str, owner: str | None = None, stored: Tensor | None = None
) -> None:
    """New ``key`` and ``value``: floating tensors of shape ``layout`` (as
    ``"(b, h_kv, n, d)"``) and of one shape; with ``owner`` (``"the cache"``), of the
    dtype and device of ``stored``."""
    ndim = layout.count(",") + 1
    for name, t in (("key", key), ("value", value)):
        check_tensor(name, t, floating=True)
        if t.dim() != ndim:
            raise ValueError(f"{name} must have shape {layout}, got {tuple(t.shape)}")
        if owner is not None and stored is not None:
            if t.dtype != stored.dtype:
                raise TypeError(
                    f"{owner} stores {stored.dtype}, got {name} of dtype {t.dtype}"
                )
            if t.device != stored.device:
                raise ValueError(
                    f"{owner} lives on {stored.device}, got {name} on {t.device}"
                )
    if key.shape != value.shape:
        raise ValueError(
            f"key and value must have the same shape, got {tuple(key.shape)} and "
            f"{tuple(value.shape)}"
        )


class CacheBuffers:
    """``dtype``, ``device`` and ``nbytes`` of a cache whose tensors :meth:`_buffers`
    lists (``keys`` and ``values`` unless a subclass says otherwise)."""

    keys: Tensor
    values: Tensor

    def _buffers(self) -> tuple[Tensor, ...]:
        return self.keys, self.values

    @property
    def dtype(self) -> torch.dtype:
        return self._buffers()[0].dtype

    @property
    def device(self) -> torch.device:
        return self._buffers()[0].device

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers, allocated up front whatever the stored length."""
        return sum(t.nbytes for t in self._buffers())


class LinearCache(CacheBuffers):
    """A cache that appends up to ``max_len`` positions, ``length`` of them stored."""

    max_len: int
    length: int

    @property
    def remaining(self) -> int:
        """Positions that still fit."""
        return self.max_len - self.length

    def reset(self) -> None:
        """Forget every stored position (the buffers are kept and overwritten later).

        The batch size, capacity, sizes, dtype and device stay those of the cache; for
        others build a new one.
        """
        self.length = 0

    def _check_fits(self, num_new: int) -> None:
        if num_new > self.remaining:
            raise ValueError(
                f"the cache holds at most max_len={self.max_len} positions: "
                f"{self.length} are stored and {num_new} more do not fit"
            )
