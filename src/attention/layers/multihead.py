"""Multi-head, grouped-query and multi-query attention (taught in chapter 6).

Shape legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``i`` query
positions, ``j`` key positions, ``d`` head size (``head_dim = embed_dim // h``).

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``, as in
``torch.nn.functional.scaled_dot_product_attention``; a float mask is added to the scores.
``nn.MultiheadAttention`` uses the opposite polarity (True = blocked): pass it ``~mask``.

The production formulation (Vaswani et al., 2017): one projection per role,
``split_heads`` by reshape + transpose to ``(b, h, L, d)``, attention in every head at once,
``merge_heads`` (the concatenation) and an output projection. With ``num_kv_heads < h``
the keys and values have fewer heads, each shared by a group of ``h / h_kv`` query heads:
grouped-query attention (GQA; Ainslie et al., 2023), or multi-query attention (MQA;
Shazeer, 2019) for ``h_kv = 1``. The KV cache for incremental decoding is in
:mod:`attention.layers.kv_cache`. With ``rope=RotaryConfig(...)`` (or ``rope=True``) the queries
and keys of every head are rotated by their positions (rotary position embedding, chapter
07) after the split into heads and before the scores, as in Llama-style models. The
attention itself is any kernel on the package's contract (``attention_fn``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_device,
    check_dtype,
    check_int,
    check_like,
    check_mask,
    check_mask_or_causal,
    check_probability,
    check_tensor,
)
from .._core import _attention
from .._rope import _apply_rope, _check_positions, _check_scaling, rope_config
from .kv_cache import KVCache
from .positional import RotaryConfig

# split_heads and merge_heads are imported from this module by chapters 6 and 17.
__all__ = ["MultiHeadAttention", "split_heads", "merge_heads"]


def _split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Unchecked core of :func:`split_heads`."""
    b, length, features = x.shape
    return x.reshape(b, length, num_heads, features // num_heads).transpose(
        1, 2
    )  # (b, h, L, d)


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """Split the feature axis into heads: ``(b, L, h*d) -> (b, h, L, d)``.

    A reshape to ``(b, L, h, d)`` (head ``n`` owns features ``n*d ... n*d + d - 1``) and a
    transpose that brings the heads next to the batch, so one batched matrix product
    serves every head.

    Example:
        >>> split_heads(torch.arange(6.0).reshape(1, 1, 6), 2).tolist()
        [[[[0.0, 1.0, 2.0]], [[3.0, 4.0, 5.0]]]]
    """
    check_tensor("x", x)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    if x.dim() != 3:
        raise ValueError(f"x must have shape (b, L, h*d), got {tuple(x.shape)}")
    if x.shape[-1] % num_heads:
        raise ValueError(
            f"the feature size must be divisible by num_heads, got {x.shape[-1]} and {num_heads}"
        )
    return _split_heads(x, num_heads)


def _merge_heads(x: Tensor) -> Tensor:
    """Unchecked core of :func:`merge_heads`."""
    return x.transpose(1, 2).flatten(2)  # (b, L, h*d)


def merge_heads(x: Tensor) -> Tensor:
    """Concatenate the heads again: ``(b, h, L, d) -> (b, L, h*d)``, the inverse of :func:`split_heads`.

    Example:
        >>> x = torch.randn(2, 5, 12)
        >>> torch.equal(merge_heads(split_heads(x, 3)), x)
        True
    """
    check_tensor("x", x)
    if x.dim() != 4:
        raise ValueError(f"x must have shape (b, h, L, d), got {tuple(x.shape)}")
    return _merge_heads(x)


def _rope_config(rope, rope_base, rope_interleaved) -> RotaryConfig | None:
    """``rope`` (a RotaryConfig, True, False or None) and the former flags, as one config."""
    if rope is not None and not isinstance(rope, (bool, RotaryConfig)):
        raise TypeError(
            f"rope must be a RotaryConfig, a bool or None, got {type(rope).__name__}"
        )
    config = rope_config(
        None if rope in (None, True, False) else rope,
        "MultiHeadAttention",
        rope_base=("base", rope_base),
        rope_interleaved=("interleaved", rope_interleaved),
    )
    return None if rope in (None, False) else config


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention with optional grouped/multi-query heads and a KV cache.

    .. math::
        \operatorname{MHA}(Q, K, V) = \operatorname{concat}(\text{head}_1, \dots,
        \text{head}_h)\, W^O, \quad
        \text{head}_n = \operatorname{softmax}\!\Big(\frac{Q W^Q_n (K W^K_{g(n)})^\top}
        {\sqrt{d}} + M\Big) V W^V_{g(n)}

    with ``g(n) = n // (h / h_kv)`` the key/value head that query head ``n`` reads.

    Args:
        embed_dim: model size of the queries and of the output; ``h * d``.
        num_heads: ``h``, query heads.
        kdim: feature size of ``key`` (default ``embed_dim``).
        vdim: feature size of ``value`` (default ``embed_dim``).
        bias: give the four projections a bias.
        dropout: probability of zeroing an attention weight, applied in training mode only.
        num_kv_heads: ``h_kv``, key/value heads (default ``h``: plain multi-head attention;
            ``1``: multi-query attention; in between: grouped-query attention). Must divide
            ``num_heads``.
        batch_first: inputs and output are ``(b, L, features)`` (True, the default) or
            ``(L, b, features)`` (False), as in ``nn.MultiheadAttention``.
        device, dtype: where and in which dtype to create the parameters.
        rope: a :class:`attention.RotaryConfig` to rotate the queries and keys of each head
            by their positions (RoPE, :func:`attention.apply_rope`) before the scores;
            ``True`` means ``RotaryConfig()``; self-attention only, and the head size must
            be even. (``rope_base=`` and ``rope_interleaved=`` are a deprecated spelling of
            ``rope=RotaryConfig(base=..., interleaved=...)``.)
        attention_fn: the attention kernel, any function on the package's contract
            ``f(q, k, v, *, attn_mask, is_causal, enable_gqa)`` with ``q`` ``(b, h, i, d)``,
            ``k, v`` ``(b, h_kv, j, d)``, e.g. :func:`attention.tiled_attention` or
            :func:`attention.attention_with_sinks` (bind its own options with
            ``functools.partial``). Default None: PyTorch's fused
            ``scaled_dot_product_attention`` (the package's reference when
            ``need_weights=True``). A custom kernel returns no weights and takes no dropout.

    Submodules (``nn.Linear``): ``w_query`` (embed_dim -> embed_dim), ``w_key``
    (kdim -> h_kv*d), ``w_value`` (vdim -> h_kv*d), ``w_out`` (embed_dim -> embed_dim).

    Example:
        >>> mha = MultiHeadAttention(16, 4, num_kv_heads=2)
        >>> x = torch.randn(2, 5, 16)
        >>> out, w = mha(x, x, x, need_weights=True)
        >>> out.shape, w.shape
        (torch.Size([2, 5, 16]), torch.Size([2, 4, 5, 5]))

    Incremental decoding with a KV cache: prefill with the prompt, then one token per call;
    the outputs equal those of the full causal call ``mha(x, x, x, is_causal=True)``.

        >>> cache = mha.new_cache(batch_size=2, max_len=5)
        >>> with torch.inference_mode():
        ...     first, _ = mha(x[:, :3], x[:, :3], x[:, :3], is_causal=True, cache=cache)
        ...     step, _ = mha(x[:, 3:4], x[:, 3:4], x[:, 3:4], is_causal=True, cache=cache)
        >>> step.shape, cache.length
        (torch.Size([2, 1, 16]), 4)
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        num_kv_heads: int | None = None,
        batch_first: bool = True,
        device=None,
        dtype: torch.dtype | None = None,
        rope: RotaryConfig | bool | None = None,
        attention_fn: Callable[..., Tensor] | None = None,
        rope_base: float | None = None,
        rope_interleaved: bool | None = None,
    ) -> None:
        super().__init__()
        embed_dim = check_int("embed_dim", embed_dim, minimum=1)
        num_heads = check_int("num_heads", num_heads, minimum=1)
        kdim = embed_dim if kdim is None else check_int("kdim", kdim, minimum=1)
        vdim = embed_dim if vdim is None else check_int("vdim", vdim, minimum=1)
        num_kv_heads = (
            num_heads
            if num_kv_heads is None
            else check_int("num_kv_heads", num_kv_heads, minimum=1)
        )
        if embed_dim % num_heads:
            raise ValueError(
                f"embed_dim must be divisible by num_heads, got {embed_dim} and {num_heads}"
            )
        if num_heads % num_kv_heads:
            raise ValueError(
                "num_heads must be divisible by num_kv_heads (each key/value head serves a "
                f"group of query heads), got {num_heads} and {num_kv_heads}"
            )
        self.batch_first = check_bool("batch_first", batch_first)
        check_bool("bias", bias)
        dropout = check_probability("dropout", dropout, closed=True)
        device = check_device("device", device)
        dtype = None if dtype is None else check_dtype("dtype", dtype, floating=True)
        self.rope = _rope_config(rope, rope_base, rope_interleaved)
        if self.rope is not None:
            if (embed_dim // num_heads) % 2:
                raise ValueError(
                    "rope rotates feature pairs, so the head size embed_dim // num_heads "
                    f"must be even, got {embed_dim // num_heads}"
                )
            _check_scaling(self.rope.scaling, embed_dim // num_heads)
        if attention_fn is not None:
            if not callable(attention_fn):
                raise TypeError(
                    f"attention_fn must be callable or None, got {type(attention_fn).__name__}"
                )
            if dropout > 0:
                raise ValueError(
                    "a custom attention_fn takes no dropout (the kernel contract has none), "
                    f"got dropout={dropout}; use dropout=0.0"
                )
        self.attention_fn = attention_fn

        self.embed_dim, self.kdim, self.vdim = embed_dim, kdim, vdim
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = float(dropout)
        kv_dim = num_kv_heads * self.head_dim
        factory = {"device": device, "dtype": dtype}
        self.w_query = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.w_key = nn.Linear(kdim, kv_dim, bias=bias, **factory)
        self.w_value = nn.Linear(vdim, kv_dim, bias=bias, **factory)
        self.w_out = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head, ``h / h_kv``."""
        return self.num_heads // self.num_kv_heads

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, dropout={self.dropout}"
            + ("" if self.batch_first else ", batch_first=False")
            + (f", rope={self.rope}" if self.rope is not None else "")
            + (
                ""
                if self.attention_fn is None
                else f", attention_fn={getattr(self.attention_fn, '__name__', self.attention_fn)}"
            )
        )

    @property
    def rope_base(self) -> float | None:
        """``rope.base`` (None without RoPE); kept for the former spelling."""
        return None if self.rope is None else self.rope.base

    @property
    def rope_interleaved(self) -> bool | None:
        """``rope.interleaved`` (None without RoPE); kept for the former spelling."""
        return None if self.rope is None else self.rope.interleaved

    def new_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        dtype: torch.dtype | None = None,
        device=None,
    ) -> KVCache:
        """An empty :class:`attention.KVCache` shaped for this module (``h_kv`` heads of size ``d``).

        dtype and device default to those of the module's parameters.
        """
        weight = self.w_key.weight
        return KVCache(
            batch_size,
            max_len,
            self.num_kv_heads,
            self.head_dim,
            dtype=weight.dtype if dtype is None else dtype,
            device=weight.device if device is None else device,
        )

    def _validate(
        self, query, key, value, attn_mask, is_causal, need_weights, cache, positions
    ):
        """Every check of :meth:`forward`, on batch-first inputs, before any projection."""
        self._check_inputs(query, key, value)
        check_mask_or_causal(attn_mask, is_causal)
        check_bool("need_weights", need_weights)
        if need_weights and self.attention_fn is not None:
            raise ValueError(
                "need_weights=True needs the reference kernel, which returns the weights; "
                "this module attends with a custom attention_fn"
            )
        b, i, j = query.shape[0], query.shape[1], key.shape[1]
        self._check_positions(positions, query, b, i, j)
        if cache is not None:
            self._check_cache(cache, key, value, is_causal, b, i, j)
            j = cache.length + j
        if attn_mask is not None:
            check_mask(
                attn_mask, query.dtype, (b, self.num_heads, i, j), device=query.device
            )

    def _check_inputs(self, query, key, value) -> None:
        """Floating ``(b, L, features)`` inputs of the module's sizes, dtype and device."""
        layout = (
            "batch-first with shape (b, L, {})"
            if self.batch_first
            else "sequence-first with shape (L, b, {})"
        )
        for name, t, size, size_name, layer in (
            ("query", query, self.embed_dim, "embed_dim", self.w_query),
            ("key", key, self.kdim, "kdim", self.w_key),
            ("value", value, self.vdim, "vdim", self.w_value),
        ):
            check_tensor(name, t, floating=True)
            if t.dim() != 3:
                raise ValueError(
                    f"{name} must be {layout.format(size_name)}, got {tuple(t.shape)}"
                )
            if t.shape[-1] != size:
                raise ValueError(
                    f"{name}'s last dimension must equal {size_name}={size}, got {t.shape[-1]}"
                )
            check_like(name, t, "the module's parameters", layer.weight)
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                "query, key and value must have the same batch size, got "
                f"{query.shape[0]}, {key.shape[0]} and {value.shape[0]}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                "key and value must have the same number of positions j, "
                f"got {key.shape[1]} and {value.shape[1]}"
            )

    def _check_positions(self, positions, query, b: int, i: int, j: int) -> None:
        """RoPE's positions: only with ``rope``, and for self-attention (``i = j``)."""
        if positions is not None and self.rope is None:
            raise ValueError(
                "positions are used by rotary embeddings only: build the module with rope=RotaryConfig()"
            )
        if self.rope is not None and i != j:
            raise ValueError(
                "with rope the keys must be the query tokens' own (self-attention), so "
                f"key and query must have the same length, got {j} and {i} (cross-attention "
                "has no shared positions)"
            )
        if positions is not None:
            check_tensor("positions", positions)
            if positions.dim() not in (1, 2):
                raise ValueError(
                    f"positions must be (i,) or (b, i), got {tuple(positions.shape)}"
                )
            _check_positions(positions, (b, i), query, "query", "(b, i)")

    def _check_cache(
        self, cache, key, value, is_causal, b: int, i: int, j: int
    ) -> None:
        """A :class:`KVCache` that takes ``j`` new positions of this module's heads."""
        if not isinstance(cache, KVCache):
            raise TypeError(
                f"cache must be a KVCache or None, got {type(cache).__name__}"
            )
        if is_causal and i != j:
            raise ValueError(
                "with a cache and is_causal=True the new queries must be the new "
                f"positions, got {i} queries and {j} new keys"
            )
        grad = torch.is_grad_enabled() and (
            key.requires_grad
            or value.requires_grad
            or any(
                p.requires_grad
                for p in (*self.w_key.parameters(), *self.w_value.parameters())
            )
        )
        weight = self.w_key.weight
        cache.check_update(
            b,
            j,
            self.num_kv_heads,
            self.head_dim,
            dtype=weight.dtype,
            device=weight.device,
            requires_grad=grad,
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        *,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value`` in every head.

        Args:
            query: ``(b, i, embed_dim)`` (``(i, b, embed_dim)`` with ``batch_first=False``).
            key: ``(b, j, kdim)`` (``(j, b, kdim)``).
            value: ``(b, j, vdim)`` (``(j, b, vdim)``).
            attn_mask: boolean (**True = may attend**) or float (added to the scores),
                broadcastable to ``(b, h, i, j)`` (with a cache, ``j`` counts the cached
                positions too). Not together with ``is_causal``.
            is_causal: causal masking. Without a cache it is PyTorch's top-left mask
                (query ``q`` sees keys ``k <= q``). With a cache the ``i`` queries are the
                newest positions and see every cached key plus the new keys up to
                themselves (bottom-right alignment, :meth:`KVCache.causal_pattern`).
            need_weights: return the per-head weights too. ``False`` runs the fused
                ``torch.nn.functional.scaled_dot_product_attention``; ``True`` the
                package's materialising :func:`attention.scaled_dot_product_attention`
                core (same result).
            cache: a :class:`attention.KVCache` (see :meth:`new_cache`). The new keys and
                values are projected, appended to it, and the queries attend to all of
                its positions. Prefill with the prompt, then call with one token at a time,
                under ``torch.inference_mode()`` or ``torch.no_grad()``.
            positions: with ``rope``, the integer positions of the ``i`` new tokens,
                ``(i,)`` or ``(b, i)``; the keys share them. Default ``arange(i)``, shifted
                by the cache's length when a cache is given, so cached decoding equals the
                full causal call.

        Returns:
            ``(output, weights)``: output ``(b, i, embed_dim)`` (``(i, b, embed_dim)`` with
            ``batch_first=False``); weights ``(b, h, i, j)``
            before dropout (rows sum to 1) if ``need_weights`` else ``None``.
            ``weights.mean(1)`` is what ``nn.MultiheadAttention`` returns by default.
        """
        if not self.batch_first:  # (L, b, features) -> (b, L, features)
            query, key, value = (
                t.transpose(0, 1) if isinstance(t, Tensor) else t
                for t in (query, key, value)
            )
        self._validate(
            query, key, value, attn_mask, is_causal, need_weights, cache, positions
        )
        q = _split_heads(self.w_query(query), self.num_heads)  # (b, h, i, d)
        k = _split_heads(self.w_key(key), self.num_kv_heads)  # (b, h_kv, j, d)
        v = _split_heads(self.w_value(value), self.num_kv_heads)  # (b, h_kv, j, d)
        if (
            self.rope is not None
        ):  # rotate queries and keys by their positions, before any score
            if positions is None:
                start = 0 if cache is None else cache.length
                positions = torch.arange(
                    start, start + q.shape[2], device=q.device
                )  # (i,)
            elif positions.dim() == 2:
                positions = positions[:, None, :]  # (b, 1, i): the same for every head
            options = (
                self.rope.base,
                self.rope.interleaved,
                _check_scaling(self.rope.scaling, self.head_dim),
            )
            q = _apply_rope(q, positions, *options)
            k = _apply_rope(k, positions, *options)
        if cache is not None:
            k, v = cache.update(k, v)  # (b, h_kv, cached + j, d)
            if is_causal:
                attn_mask, is_causal = cache.causal_pattern(q.shape[2])
        dropout_p = self.dropout if self.training else 0.0
        gqa = self.num_groups > 1
        if self.attention_fn is not None:
            weights = None
            context = self.attention_fn(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=gqa
            )
        elif need_weights:
            context, weights = _attention(
                q, k, v, attn_mask, is_causal, None, gqa, dropout_p
            )
        else:
            weights = None
            context = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                enable_gqa=gqa,
            )  # (b, h, i, d)
        out = self.w_out(
            _merge_heads(context)
        )  # (b, i, embed_dim): the heads concatenated
        return (out if self.batch_first else out.transpose(0, 1)), weights

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of an ``nn.MultiheadAttention``'s weights in this module.

        Handles the packed ``in_proj_weight`` (``kdim = vdim = embed_dim``) and the separate
        ``q/k/v_proj_weight``, with or without bias. The result takes batch-first inputs
        whatever ``module.batch_first`` says, and boolean masks with True = may attend
        (invert the masks given to the torch module). In evaluation mode
        ``out, w = copy(q, k, v, need_weights=True)`` matches ``module``'s output and
        ``w.mean(1)`` its head-averaged weights.

        Raises:
            ValueError: for ``add_bias_kv=True`` or ``add_zero_attn=True``, which this
                module does not implement.
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(
                f"module must be an nn.MultiheadAttention, got {type(module).__name__}"
            )
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError(
                "add_bias_kv and add_zero_attn are not supported: the module must be built "
                "with add_bias_kv=False, add_zero_attn=False"
            )
        e = module.embed_dim
        bias = module.in_proj_bias is not None
        if module._qkv_same_embed_dim:
            w_q, w_k, w_v = module.in_proj_weight.detach().chunk(
                3, dim=0
            )  # (E, E) each
        else:
            w_q, w_k, w_v = (
                module.q_proj_weight.detach(),
                module.k_proj_weight.detach(),
                module.v_proj_weight.detach(),
            )
        ref = module.out_proj.weight
        new = cls(
            e,
            module.num_heads,
            kdim=module.kdim,
            vdim=module.vdim,
            bias=bias,
            dropout=module.dropout,
            device=ref.device,
            dtype=ref.dtype,
        )
        layers = (new.w_query, new.w_key, new.w_value, new.w_out)
        weights = (w_q, w_k, w_v, module.out_proj.weight)
        biases = (
            (*module.in_proj_bias.chunk(3), module.out_proj.bias)
            if bias
            else (None,) * 4
        )
        with torch.no_grad():
            for layer, weight, b in zip(layers, weights, biases):
                layer.weight.copy_(weight)
                if b is not None:
                    layer.bias.copy_(b)
        new.train(module.training)
        return new
