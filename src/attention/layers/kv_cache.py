"""The key/value cache for incremental decoding (taught in chapter 6).

Shape legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``i`` query
positions, ``j`` key positions, ``d`` head size.

An autoregressive decoder produces one token at a time. The keys and values of the
tokens already seen never change, so instead of projecting the whole prefix again at
every step we keep them in a preallocated buffer of shape ``(b, h_kv, max_len, d)`` and
append only the new positions. A new query must see *every* cached key plus the new keys
up to itself: the causal mask is aligned bottom-right (:func:`attention.decoding_mask`),
not top-left as ``is_causal=True`` means for a square mask.

The cache costs ``2 * h_kv * d * bytes_per_element`` bytes per token per layer (one key
and one value vector per key/value head), which is what multi-query and grouped-query
attention shrink (:func:`kv_cache_bytes_per_token`).

The buffers are written in place, so the cache is for inference: use it under
``torch.inference_mode()`` or ``torch.no_grad()``. :meth:`KVCache.update` refuses keys
or values that carry an autograd graph, rather than failing later in ``backward()``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._cache import LinearCache, check_new_kv, zero_buffers
from .._checks import check_dtype, check_int, check_sizes
from ..foundations.masks import causal_mask

# The facade re-exports the library names (the first 1); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "KVCache",
    "kv_cache_bytes_per_token",
]


class KVCache(LinearCache):
    """Preallocated keys and values of the positions decoded so far.

    Args:
        batch_size: ``b``, fixed for the cache's lifetime.
        max_len: capacity in positions.
        num_kv_heads: ``h_kv``.
        head_dim: ``d`` (keys and values share it in
            :class:`attention.MultiHeadAttention`).
        dtype: element type of the buffers (default ``torch.get_default_dtype()``).
        device: where the buffers live.

    Attributes:
        keys, values: the ``(b, h_kv, max_len, d)`` buffers; only ``[:, :, :length]`` is
            valid.
        length: number of positions stored.

    Example:
        >>> cache = KVCache(1, 4, num_kv_heads=2, head_dim=3)
        >>> k, v = cache.update(torch.zeros(1, 2, 3, 3), torch.zeros(1, 2, 3, 3))
        >>> k.shape, cache.length, cache.remaining
        (torch.Size([1, 2, 3, 3]), 3, 1)
    """

    def __init__(
        self,
        batch_size: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype | None = None,
        device=None,
    ) -> None:
        self.batch_size, self.max_len, self.num_kv_heads, self.head_dim = check_sizes(
            batch_size=batch_size,
            max_len=max_len,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
        )
        shape = (self.batch_size, self.num_kv_heads, self.max_len, self.head_dim)
        self.keys, self.values = zero_buffers(
            shape, dtype, device
        )  # (b, h_kv, max_len, d) each
        self.length = 0

    def check_update(
        self,
        batch_size: int,
        num_new: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        requires_grad: bool = False,
    ) -> None:
        """Check that :meth:`update` would accept keys and values described by these
        numbers.

        The interface for modules: :class:`attention.MultiHeadAttention` calls it before
        projecting anything, so a wrong call fails at the boundary with a clear message.

        Args:
            batch_size, num_new, num_kv_heads, head_dim: the ``(b, h_kv, n, d)`` of the
                keys.
            dtype, device: theirs.
            requires_grad: whether they will require grad while autograd is on.

        Raises:
            ValueError: for another batch size, head count or size, more positions than
                fit, another device, keys that require grad, or a cache created under
                ``torch.inference_mode()`` used outside it.
            TypeError: for another dtype.
        """
        if batch_size != self.batch_size:
            raise ValueError(
                f"the cache was built for batch size {self.batch_size}, "
                f"got a batch of {batch_size}; a cache keeps its batch size: "
                "create a new one for this batch"
            )
        if num_kv_heads != self.num_kv_heads or head_dim != self.head_dim:
            raise ValueError(
                f"the cache holds {self.num_kv_heads} key/value heads of size "
                f"{self.head_dim}, got {num_kv_heads} heads of size {head_dim}"
            )
        self._check_fits(num_new)
        if dtype != self.dtype:
            raise TypeError(
                f"the cache stores {self.dtype}, got keys and values of {dtype}"
            )
        if device != self.device:
            raise ValueError(
                "the cache and the new keys must be on the same device, "
                f"got {self.device} and {device}"
            )
        if requires_grad:
            raise ValueError(
                "the cache writes its buffers in place, which autograd "
                "cannot differentiate through; got keys or values that require grad: "
                "decode under torch.inference_mode() or "
                "torch.no_grad() (or pass detached tensors)"
            )
        if self.keys.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(
                "this cache was created under torch.inference_mode(), so its buffers "
                "can only be written there: update it under torch.inference_mode() "
                "too, or create it outside (e.g. under torch.no_grad())"
            )

    _check_update = check_update  # the former private spelling

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``n`` new positions and return the keys and values of all positions so
        far.

        Args:
            key: ``(b, h_kv, n, d)`` keys of the new positions (already projected, split
                into heads).
            value: ``(b, h_kv, n, d)`` their values.

        Returns:
            ``(keys, values)``, each ``(b, h_kv, length, d)`` with ``length`` counting
            the new positions: views into the buffers, valid until the next update.

        Raises:
            ValueError: for a batch size, head count or size other than the cache's,
                more positions than fit, another device, or keys/values that require
                grad while autograd is on.
            TypeError: for non-tensors or another dtype.
        """
        check_new_kv(key, value, "(b, h_kv, n, d)")
        if key.dtype != value.dtype or key.device != value.device:
            raise TypeError(
                f"key and value must share a dtype and device, got {key.dtype} "
                f"on {key.device} and {value.dtype} on {value.device}"
            )
        grad = torch.is_grad_enabled() and (key.requires_grad or value.requires_grad)
        b, h_kv, n, d = key.shape
        self.check_update(
            b, n, h_kv, d, dtype=key.dtype, device=key.device, requires_grad=grad
        )
        return self._append(key, value)

    def _append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Unchecked core of :meth:`update`."""
        start, stop = self.length, self.length + key.shape[2]
        self.keys[:, :, start:stop] = key
        self.values[:, :, start:stop] = value
        self.length = stop
        return self.keys[:, :, :stop], self.values[:, :, :stop]  # (b, h_kv, length, d)

    def causal_pattern(self, num_new: int) -> tuple[Tensor | None, bool]:
        """``(attn_mask, is_causal)`` for the ``num_new`` newest positions after an
        update.

        The new queries are the last ``num_new`` positions: each sees every earlier
        cached key and the new keys up to itself, a causal mask aligned bottom-right
        (``causal_mask(num_new, length, align="bottom-right")``). Returned in the
        cheapest form for ``scaled_dot_product_attention``: ``is_causal=True`` when
        nothing was cached before (the square, top-left case), no mask at all for a
        single new query (it sees everything), else the mask.

        Example:
            >>> cache = KVCache(1, 8, num_kv_heads=1, head_dim=2)
            >>> _ = cache.update(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))
            >>> mask, is_causal = cache.causal_pattern(2)
            >>> mask.int().tolist(), is_causal
            ([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], False)
        """
        num_new = check_int("num_new", num_new, minimum=0)
        if num_new > self.length:
            raise ValueError(
                f"num_new must be <= the stored length {self.length}, got {num_new}"
            )
        if num_new == self.length:
            return None, True
        if num_new == 1:
            return None, False
        return causal_mask(
            num_new, self.length, align="bottom-right", device=self.device
        ), False

    def __repr__(self) -> str:
        return (
            f"KVCache(batch_size={self.batch_size}, "
            f"length={self.length}/{self.max_len}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, dtype={self.dtype})"
        )


def kv_cache_bytes_per_token(
    num_kv_heads: int,
    head_dim: int,
    *,
    dtype: torch.dtype = torch.float16,
    num_layers: int = 1,
) -> int:
    r"""Bytes the KV cache needs per token:
    :math:`2 \cdot h_{kv} \cdot d \cdot \text{bytes} \cdot L`.

    One key and one value vector of size ``head_dim`` per key/value head, per layer.
    With the default ``num_layers=1`` this is the cost per token per layer.

    Args:
        num_kv_heads: ``h_kv`` (= ``h`` for multi-head, 1 for multi-query attention).
        head_dim: ``d``.
        dtype: element type of the cache.
        num_layers: multiply by the number of layers.

    Example:
        >>> kv_cache_bytes_per_token(32, 128)  # 32 heads of 128, fp16: 16 KiB
        16384
        >>> kv_cache_bytes_per_token(8, 128, num_layers=32)  # GQA, whole model
        131072
    """
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, minimum=1)
    head_dim = check_int("head_dim", head_dim, minimum=1)
    num_layers = check_int("num_layers", num_layers, minimum=1)
    check_dtype("dtype", dtype)
    return 2 * num_kv_heads * head_dim * dtype.itemsize * num_layers
