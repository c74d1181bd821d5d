"""Attention sinks: learned sink logits (gpt-oss), the StreamingLLM cache (chapter 18).

Shape legend: ``b`` batch (any number of leading dims), ``h`` query heads, ``h_kv``
key/value heads, ``i`` query positions, ``j`` key positions, ``d`` query/key size,
``e`` value size, ``n`` sequence length when ``i = j``.

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``, as
in ``torch.nn.functional.scaled_dot_product_attention``; a float mask is added to the
scores.

Trained transformers park much of their attention weight on the first token(s), whatever
those tokens are: a softmax row must sum to one, and a head with nothing useful to read
still has to put its weight somewhere. Xiao et al. (2024) called these tokens *attention
sinks* and showed two consequences, both implemented here:

* A cache that keeps only the last ``w`` tokens (sliding-window decoding) breaks down as
  soon as the first tokens are evicted; keeping the first ``s`` tokens as well
  (:class:`StreamingKVCache`) restores it at a constant memory.
* A model can be given a sink on purpose: one learned logit per head that joins every
  softmax row and whose share is thrown away (:func:`attention_with_sinks`, as in
  OpenAI's gpt-oss). Equivalently, an extra key whose score is the sink logit and whose
  value is zero.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._cache import CacheBuffers, check_new_kv, zero_buffers
from .._checks import (
    check_int,
    check_same_device,
    check_sizes,
    check_tensor,
    validate_attention,
    validate_weights,
)
from .._core import attention_scores, expand_kv_heads, masked_softmax

# The facade re-exports the library names (the first 3); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "attention_with_sinks",
    "sink_attention_weights",
    "StreamingKVCache",
    "streaming_mask",
]


# ------------------------------------------------------------------ learned sinks


def _check_sinks(sinks, query: Tensor) -> None:
    check_tensor("sinks", sinks, floating=True)
    if query.dim() < 3:
        raise ValueError(
            "attention with sinks needs a heads axis: query of shape (..., h, i, d), "
            f"got {tuple(query.shape)}"
        )
    h = query.shape[-3]
    if tuple(sinks.shape) != (h,):
        raise ValueError(
            f"sinks must have shape (h,) = ({h},), one logit per query head, got "
            f"{tuple(sinks.shape)}"
        )
    check_same_device(query=query, sinks=sinks)


def _sink_weights(query, key, sinks, attn_mask, is_causal, scale, enable_gqa) -> Tensor:
    """Unchecked core: ``(..., h, i, j)`` weights of the real keys.

    The sink's share is dropped.
    """
    scores, attn_mask = attention_scores(
        query, key, attn_mask, is_causal, scale, enable_gqa
    )  # (..., h, i, j)
    sink = sinks.to(scores.dtype)[:, None, None].expand(
        *scores.shape[:-1], 1
    )  # (..., h, i, 1)
    logits = torch.cat([scores, sink], dim=-1)  # (..., h, i, j + 1)
    if attn_mask is not None:  # the sink column is always visible
        mask = attn_mask.expand(scores.shape)
        visible = (
            torch.ones_like(mask[..., :1])
            if mask.dtype == torch.bool
            else mask.new_zeros(())
        )
        attn_mask = torch.cat([mask, visible.expand(*scores.shape[:-1], 1)], dim=-1)
    return masked_softmax(logits, attn_mask)[..., :-1]  # (..., h, i, j)


def sink_attention_weights(
    query: Tensor,
    key: Tensor,
    sinks: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    r"""The weights of :func:`attention_with_sinks`: a softmax over scores and a sink.

    The sink is one learned logit per head:

    .. math::
        A_{ij} = \frac{e^{s_{ij}}}{e^{\sigma_h} + \sum_{j'} e^{s_{ij'}}}, \qquad
        s_{ij} = q_i \cdot k_j \cdot \text{scale} + M_{ij}

    Each row sums to :math:`1 - \text{(the sink's share)} < 1`: equivalently the plain
    weights multiplied by
    :math:`\operatorname{sigmoid}(\operatorname{logsumexp}_j s_{ij} - \sigma_h)`.

    Args:
        query: ``(..., h, i, d)``.
        key: ``(..., h_kv, j, d)``.
        sinks: ``(h,)``, one logit :math:`\sigma_h` per query head; ``-inf`` gives plain
            attention.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``; the sink is never masked.
        is_causal: top-left causal mask; not together with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: ``h`` a multiple of ``h_kv``; query head ``n`` reads key head
            ``n // (h / h_kv)``.

    Returns:
        ``(..., h, i, j)`` weights; masked entries are exactly 0.

    Example:
        >>> # (h, i, d), (h, j, d): scores 0
        >>> q, k = torch.zeros(1, 1, 2), torch.zeros(1, 2, 2)
        >>> # e^0 / (e^0 + e^0 + e^0) each
        >>> w = sink_attention_weights(q, k, torch.zeros(1))
        >>> [round(x, 4) for x in w.flatten().tolist()]
        [0.3333, 0.3333]
    """
    validate_weights(query, key, attn_mask, is_causal, scale, enable_gqa)
    _check_sinks(sinks, query)
    return _sink_weights(query, key, sinks, attn_mask, is_causal, scale, enable_gqa)


def attention_with_sinks(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    sinks: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    r"""Scaled dot-product attention with one learned sink logit per head (gpt-oss).

    Each row's softmax runs over its scores *and* the head's sink logit
    :math:`\sigma_h`; the sink's share is dropped, so a head may give less than all of
    its weight to the keys (none at all when :math:`\sigma_h` dominates):

    .. math::
        o_i = \sum_j \frac{e^{s_{ij}}}{e^{\sigma_h} + \sum_{j'} e^{s_{ij'}}}\, v_j

    the same as attending to one extra key whose score is :math:`\sigma_h` and whose
    value is zero. Equal to the eager attention of Hugging Face's ``GptOssAttention``,
    and to plain attention when every sink is ``-inf``.

    Args:
        query: ``(..., h, i, d)``.
        key: ``(..., h_kv, j, d)``.
        value: ``(..., h_kv, j, e)``.
        sinks: ``(h,)`` sink logits (cast to the query's dtype).
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., h, i, j)``; the sink is never masked.
        is_causal: top-left causal mask; not together with ``attn_mask``.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: ``h`` a multiple of ``h_kv``; query head ``n`` reads key/value head
            ``n // (h / h_kv)``.

    Returns:
        ``(..., h, i, e)``. A query with no visible key gets a zero output (all its
        weight goes to the sink).

    Example:
        >>> q, k, v = torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), torch.ones(1, 1, 1)
        >>> attention_with_sinks(q, k, v, torch.zeros(1)).tolist()  # half to the sink
        [[[0.5]]]
        >>> attention_with_sinks(q, k, v, torch.full((1,), -torch.inf)).tolist()
        [[[1.0]]]
    """
    validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    _check_sinks(sinks, query)
    weights = _sink_weights(query, key, sinks, attn_mask, is_causal, scale, enable_gqa)
    if enable_gqa:
        value = expand_kv_heads(value, query.shape[-3])  # (..., h, j, e)
    return weights @ value  # (..., h, i, e)


# ------------------------------------------------------------------ StreamingLLM


def streaming_mask(n: int, num_sink: int, window: int, *, device=None) -> Tensor:
    """The mask a :class:`StreamingKVCache` realises, ``(n, n)``; True = may attend.

    Query ``q`` sees key ``k`` iff ``k <= q`` and either ``k < num_sink`` (a sink token)
    or ``q - k < window`` (one of the ``window`` most recent positions, itself
    included). ``num_sink = 0`` is plain sliding-window decoding.

    Args:
        n: sequence length.
        num_sink: ``s``, first positions kept forever, ``>= 0``.
        window: ``w``, most recent positions kept, ``>= 1``.

    Returns:
        ``(n, n)`` boolean tensor.

    Example:
        >>> for row in streaming_mask(5, 1, 2).int().tolist():
        ...     print(row)
        [1, 0, 0, 0, 0]
        [1, 1, 0, 0, 0]
        [1, 1, 1, 0, 0]
        [1, 0, 1, 1, 0]
        [1, 0, 0, 1, 1]
    """
    n = check_int("n", n, minimum=0)
    num_sink = check_int("num_sink", num_sink, minimum=0)
    window = check_int("window", window, minimum=1)
    q = torch.arange(n, device=device)[:, None]  # (i, 1)
    k = torch.arange(n, device=device)[None, :]  # (1, j)
    return (k <= q) & ((k < num_sink) | (q - k < window))  # (i, j)


class StreamingKVCache(CacheBuffers):
    """A constant-size cache of the first ``s`` positions (sinks) and the last ``w``.

    Decoding through it equals dense attention with :func:`streaming_mask`: each query
    sees the ``s`` sink positions and the ``w`` most recent positions up to itself. The
    sinks sit in slots ``0 .. s-1``; the window is a ring buffer in slots
    ``s .. s+w-1``, position ``p >= s`` in slot ``s + (p - s) % w``, overwriting
    position ``p - w``. The keys are stored as given, so positional rotations applied
    before caching keep the original positions (StreamingLLM instead re-encodes
    positions inside the cache, which needs the keys before rotation; that changes the
    model's numbers, not the memory).

    Args:
        batch_size: ``b``.
        num_sink: ``s >= 0`` first positions kept forever (0: a plain sliding window).
        window: ``w >= 1`` most recent positions kept.
        num_kv_heads: ``h_kv``.
        head_dim: ``d`` (keys and values share it).
        dtype: element type of the buffers (default ``torch.get_default_dtype()``).
        device: where the buffers live.

    Attributes:
        keys, values: ``(b, h_kv, s + w, d)`` buffers.
        positions: ``(s + w,)`` position held by each slot, ``-1`` for an empty slot.
        length: positions seen so far (kept or evicted).

    Example:
        >>> cache = StreamingKVCache(1, num_sink=1, window=2, num_kv_heads=1,
        ...                          head_dim=1)
        >>> one = torch.ones(1, 1, 1, 1)  # (b, h_kv, n, d)
        >>> for t in range(5):
        ...     k, v, mask = cache.update(one, one)
        >>> cache.positions.tolist()  # slot 0: the sink; slots 1, 2: the ring
        [0, 3, 4]
        >>> # the last query saw positions 0, 3, 2 (evicted since) and 4
        >>> mask.int().tolist()
        [[1, 1, 0, 1]]
    """

    def __init__(
        self,
        batch_size: int,
        num_sink: int,
        window: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype | None = None,
        device=None,
    ) -> None:
        sizes = check_sizes(
            zero_ok=("num_sink",),
            batch_size=batch_size,
            num_sink=num_sink,
            window=window,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
        )
        (
            self.batch_size,
            self.num_sink,
            self.window,
            self.num_kv_heads,
            self.head_dim,
        ) = sizes
        slots = self.num_sink + self.window
        shape = (self.batch_size, self.num_kv_heads, slots, self.head_dim)
        self.keys, self.values = zero_buffers(
            shape, dtype, device
        )  # (b, h_kv, s + w, d) each
        self.positions = torch.full(
            (slots,), -1, dtype=torch.long, device=self.device
        )  # (s + w,)
        self.length = 0

    def reset(self) -> None:
        """Forget every position."""
        self.positions.fill_(-1)
        self.length = 0

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Add ``n`` new positions; return what their queries may attend to.

        Args:
            key: ``(b, h_kv, n, d)`` keys of the next ``n`` positions.
            value: ``(b, h_kv, n, d)`` their values.

        Returns:
            ``(keys, values, attn_mask)``: the kept positions followed by the new ones,
            ``(b, h_kv, m + n, d)`` each, and the ``(n, m + n)`` boolean mask (True =
            may attend) of :func:`streaming_mask` restricted to them. Pass the three to
            any attention kernel with the ``n`` new queries. Then the cache keeps only
            the sinks and the last ``w`` positions.
        """
        check_new_kv(key, value, "(b, h_kv, n, d)", "the cache", self.keys)
        b, h_kv, n, d = key.shape
        if (b, h_kv, d) != (self.batch_size, self.num_kv_heads, self.head_dim):
            raise ValueError(
                f"the cache holds a batch of {self.batch_size} with "
                f"{self.num_kv_heads} key/value heads of size {self.head_dim}, got "
                f"{b}, {h_kv} and {d}"
            )
        kept = self.positions >= 0  # (s + w,) slots in use
        new_pos = torch.arange(self.length, self.length + n, device=self.device)  # (n,)
        key_pos = torch.cat([self.positions[kept], new_pos])  # (m + n,)
        keys = torch.cat([self.keys[:, :, kept], key], dim=2)  # (b, h_kv, m + n, d)
        values = torch.cat([self.values[:, :, kept], value], dim=2)
        q, k = new_pos[:, None], key_pos[None, :]
        mask = (k <= q) & ((k < self.num_sink) | (q - k < self.window))  # (n, m + n)

        # keep the sinks and the last w positions: only those new positions are written
        survive = (new_pos < self.num_sink) | (new_pos >= self.length + n - self.window)
        pos = new_pos[survive]
        slot = torch.where(
            pos < self.num_sink,
            pos,
            self.num_sink + (pos - self.num_sink) % self.window,
        )
        self.keys[:, :, slot] = key[:, :, survive]
        self.values[:, :, slot] = value[:, :, survive]
        self.positions[slot] = pos
        self.length += n
        return keys, values, mask

    def __repr__(self) -> str:
        return (
            f"StreamingKVCache(batch_size={self.batch_size}, num_sink={self.num_sink}, "
            f"window={self.window}, length={self.length}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"dtype={self.dtype})"
        )
