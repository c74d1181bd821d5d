"""Multi-head, grouped-query and multi-query attention (taught in chapter 6).

Shape legend: ``b`` batch, ``h`` query heads, ``h_kv`` key/value heads, ``i`` query
positions, ``j`` key positions, ``d`` head size (``head_dim``, by default
``embed_dim // h``).

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, h, i, j)``, as
in ``torch.nn.functional.scaled_dot_product_attention``; a float mask is added to the
scores. ``nn.MultiheadAttention`` uses the opposite polarity (True = blocked): pass it
``~mask``.

The production formulation (Vaswani et al., 2017): one projection per role,
``split_heads`` by reshape + transpose to ``(b, h, L, d)``, attention in every head at
once, ``merge_heads`` (the concatenation) and an output projection. With
``num_kv_heads < h`` the keys and values have fewer heads, each shared by a group of
``h / h_kv`` query heads: grouped-query attention (GQA; Ainslie et al., 2023), or
multi-query attention (MQA; Shazeer, 2019) for ``h_kv = 1``. The KV cache for
incremental decoding is in :mod:`attention.layers.kv_cache`. With
``rope=RotaryConfig(...)`` the queries and keys of every head are rotated by their
positions (rotary position embedding, chapter 7) after the split into heads and before
the scores, as in Llama-style models. The attention itself is one call of a kernel on
the package's contract (``attention_fn``), by default PyTorch's fused
``scaled_dot_product_attention``.
"""

from __future__ import annotations

import inspect
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
from .._rope import check_positions, check_scaling, rope_config, rope_rotate
from ..foundations.scaled_dot_product import (
    attention_weights,
    scaled_dot_product_attention,
)
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

    A reshape to ``(b, L, h, d)`` (head ``n`` owns features ``n*d ... n*d + d - 1``) and
    a transpose that brings the heads next to the batch, so one batched matrix product
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
            "the feature size must be divisible by num_heads, "
            f"got {x.shape[-1]} and {num_heads}"
        )
    return _split_heads(x, num_heads)


def _merge_heads(x: Tensor) -> Tensor:
    """Unchecked core of :func:`merge_heads`."""
    return x.transpose(1, 2).flatten(2)  # (b, L, h*d)


def merge_heads(x: Tensor) -> Tensor:
    """Concatenate the heads again: ``(b, h, L, d) -> (b, L, h*d)``, the inverse of
    :func:`split_heads`.

    Example:
        >>> x = torch.randn(2, 5, 12)
        >>> torch.equal(merge_heads(split_heads(x, 3)), x)
        True
    """
    check_tensor("x", x)
    if x.dim() != 4:
        raise ValueError(f"x must have shape (b, h, L, d), got {tuple(x.shape)}")
    return _merge_heads(x)


# The softmax kernels whose weights attention_weights reproduces (need_weights=True).
_SOFTMAX_KERNELS = (F.scaled_dot_product_attention, scaled_dot_product_attention)


def _takes_dropout(fn: Callable) -> bool:
    """Whether ``fn`` takes ``dropout_p=`` (True when its signature cannot be read)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature, e.g. torch's SDPA
        return True
    return any(
        p.name == "dropout_p" or p.kind is inspect.Parameter.VAR_KEYWORD
        for p in parameters
    )


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention with optional grouped/multi-query heads and a KV cache.

    .. math::
        \operatorname{MHA}(Q, K, V) = \operatorname{concat}(\text{head}_1, \dots,
        \text{head}_h)\, W^O, \quad
        \text{head}_n = \operatorname{softmax}\!\Big(\frac{Q W^Q_n (K W^K_{g(n)})^\top}
        {\sqrt{d}} + M\Big) V W^V_{g(n)}

    with ``g(n) = n // (h / h_kv)`` the key/value head that query head ``n`` reads. The
    forward pass has one path: project, split into heads, rotate (RoPE), append to the
    cache, attend with ``attention_fn``, merge the heads, project out.

    Args:
        embed_dim: model size of the queries and of the output.
        num_heads: ``h``, query heads.
        head_dim: ``d``, the size of each head (default ``embed_dim // num_heads``,
            which must then divide). Independent of ``embed_dim``, as in Hugging Face's
            configs (Gemma 7B: 16 heads of 256 on a model size of 3072).
        num_kv_heads: ``h_kv``, key/value heads (default ``h``: plain multi-head
            attention; ``1``: multi-query attention; in between: grouped-query
            attention). Must divide ``num_heads``.
        kdim: feature size of ``key`` (default ``embed_dim``).
        vdim: feature size of ``value`` (default ``embed_dim``).
        bias: give the four projections a bias.
        dropout: probability of zeroing an attention weight, applied in training mode
            only (passed to ``attention_fn`` as ``dropout_p``, which it must accept).
        batch_first: inputs and output are ``(b, L, features)`` (True, the default) or
            ``(L, b, features)`` (False), as in ``nn.MultiheadAttention``.
        rope: a :class:`attention.RotaryConfig` to rotate the queries and keys of each
            head by their positions (RoPE, :func:`attention.apply_rope`) before the
            scores; self-attention only, and ``head_dim`` must be even. None: no RoPE.
        attention_fn: the attention kernel, any function on the package's contract
            ``f(q, k, v, *, attn_mask, is_causal, enable_gqa)`` with ``q``
            ``(b, h, i, d)``, ``k, v`` ``(b, h_kv, j, d)``, returning ``(b, h, i, d)``:
            e.g. :func:`attention.tiled_attention` or
            :func:`attention.attention_with_sinks` (bind its own options with
            ``functools.partial``). Default: PyTorch's fused
            ``torch.nn.functional.scaled_dot_product_attention``, the fastest exact
            kernel on every device, which never stores the ``(i, j)`` weights and equals
            the package's reference :func:`attention.scaled_dot_product_attention` (pass
            that to watch every step).
        device, dtype: where and in which dtype to create the parameters.

    Submodules (``nn.Linear``): ``w_query`` (embed_dim -> h*d), ``w_key``
    (kdim -> h_kv*d), ``w_value`` (vdim -> h_kv*d), ``w_out`` (h*d -> embed_dim).

    Example:
        >>> mha = MultiHeadAttention(16, 4, num_kv_heads=2)
        >>> x = torch.randn(2, 5, 16)
        >>> out, w = mha(x, x, x, need_weights=True)
        >>> out.shape, w.shape
        (torch.Size([2, 5, 16]), torch.Size([2, 4, 5, 5]))

    Incremental decoding with a KV cache: prefill with the prompt, then one token per
    call; the outputs equal those of the full causal call
    ``mha(x, x, x, is_causal=True)``.

        >>> cache = mha.new_cache(batch_size=2, max_len=5)
        >>> prompt, token = x[:, :3], x[:, 3:4]
        >>> with torch.inference_mode():
        ...     first, _ = mha(prompt, prompt, prompt, is_causal=True, cache=cache)
        ...     step, _ = mha(token, token, token, is_causal=True, cache=cache)
        >>> step.shape, cache.length
        (torch.Size([2, 1, 16]), 4)
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        head_dim: int | None = None,
        num_kv_heads: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        batch_first: bool = True,
        rope: RotaryConfig | None = None,
        attention_fn: Callable[..., Tensor] | None = None,
        device=None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        embed_dim = check_int("embed_dim", embed_dim, minimum=1)
        num_heads = check_int("num_heads", num_heads, minimum=1)
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(
                    "embed_dim must be divisible by num_heads when head_dim is not "
                    f"given, got {embed_dim} and {num_heads}"
                )
            head_dim = embed_dim // num_heads
        head_dim = check_int("head_dim", head_dim, minimum=1)
        num_kv_heads = (
            num_heads
            if num_kv_heads is None
            else check_int("num_kv_heads", num_kv_heads, minimum=1)
        )
        if num_heads % num_kv_heads:
            raise ValueError(
                "num_heads must be divisible by num_kv_heads (each key/value head "
                f"serves a group of query heads), got {num_heads} and {num_kv_heads}"
            )
        kdim = embed_dim if kdim is None else check_int("kdim", kdim, minimum=1)
        vdim = embed_dim if vdim is None else check_int("vdim", vdim, minimum=1)
        check_bool("bias", bias)
        dropout = check_probability("dropout", dropout, closed=True)
        self.batch_first = check_bool("batch_first", batch_first)
        self.rope = rope_config(rope, default=None)
        if self.rope is not None:
            if head_dim % 2:
                raise ValueError(
                    "rope rotates feature pairs, so head_dim must be even, got "
                    f"{head_dim}"
                )
            check_scaling(self.rope.scaling, head_dim)
        if attention_fn is None:
            attention_fn = F.scaled_dot_product_attention
        elif not callable(attention_fn):
            raise TypeError(
                "attention_fn must be callable or None, got "
                f"{type(attention_fn).__name__}"
            )
        if dropout > 0 and not _takes_dropout(attention_fn):
            raise ValueError(
                f"dropout={dropout} is passed to attention_fn as dropout_p, which "
                f"{getattr(attention_fn, '__name__', attention_fn)} does not take "
                "(the kernel contract has no dropout); use dropout=0.0"
            )
        device = check_device("device", device)
        dtype = None if dtype is None else check_dtype("dtype", dtype, floating=True)

        self.attention_fn = attention_fn
        self.embed_dim, self.kdim, self.vdim = embed_dim, kdim, vdim
        self.num_heads, self.num_kv_heads, self.head_dim = (
            num_heads,
            num_kv_heads,
            head_dim,
        )
        self.dropout = float(dropout)
        factory = {"device": device, "dtype": dtype}
        self.w_query = nn.Linear(embed_dim, num_heads * head_dim, bias=bias, **factory)
        self.w_key = nn.Linear(kdim, num_kv_heads * head_dim, bias=bias, **factory)
        self.w_value = nn.Linear(vdim, num_kv_heads * head_dim, bias=bias, **factory)
        self.w_out = nn.Linear(num_heads * head_dim, embed_dim, bias=bias, **factory)

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head, ``h / h_kv``."""
        return self.num_heads // self.num_kv_heads

    def extra_repr(self) -> str:
        kernel = self.attention_fn
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"dropout={self.dropout}"
            + ("" if self.batch_first else ", batch_first=False")
            + (f", rope={self.rope}" if self.rope is not None else "")
            + (
                ""
                if kernel is F.scaled_dot_product_attention
                else f", attention_fn={getattr(kernel, '__name__', kernel)}"
            )
        )

    def new_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        dtype: torch.dtype | None = None,
        device=None,
    ) -> KVCache:
        """An empty :class:`attention.KVCache` shaped for this module (``h_kv`` heads of
        size ``d``).

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
        """Every check of :meth:`forward` after :meth:`_check_inputs`, on batch-first
        inputs, before any projection."""
        check_mask_or_causal(attn_mask, is_causal)
        check_bool("need_weights", need_weights)
        if need_weights and self.attention_fn not in _SOFTMAX_KERNELS:
            raise ValueError(
                "need_weights=True returns the softmax weights of the reference, which "
                "are the weights of this module's kernel only for softmax attention: "
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
        """Floating 3-d inputs of the module's sizes, dtype, device, in its layout."""
        if self.batch_first:
            layout, batch_axis, length_axis = "batch-first with shape (b, L, {})", 0, 1
        else:
            layout, batch_axis, length_axis = (
                "sequence-first with shape (L, b, {})",
                1,
                0,
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
                    f"{name}'s last dimension must equal {size_name}={size}, "
                    f"got {t.shape[-1]}"
                )
            check_like(name, t, "the module's parameters", layer.weight)
        sizes = [t.shape[batch_axis] for t in (query, key, value)]
        if len(set(sizes)) > 1:
            raise ValueError(
                "query, key and value must have the same batch size, got "
                f"{sizes[0]}, {sizes[1]} and {sizes[2]}"
            )
        if key.shape[length_axis] != value.shape[length_axis]:
            raise ValueError(
                "key and value must have the same number of positions j, "
                f"got {key.shape[length_axis]} and {value.shape[length_axis]}"
            )

    def _check_positions(self, positions, query, b: int, i: int, j: int) -> None:
        """RoPE's positions: only with ``rope``, and for self-attention (``i = j``)."""
        if positions is not None and self.rope is None:
            raise ValueError(
                "positions are used by rotary embeddings only: build the module with "
                "rope=RotaryConfig()"
            )
        if self.rope is not None and i != j:
            raise ValueError(
                "with rope the keys must be the query tokens' own (self-attention), "
                f"so key and query must have the same length, got {j} "
                f"and {i} (cross-attention has no shared positions)"
            )
        if positions is not None:
            check_tensor("positions", positions)
            if positions.dim() not in (1, 2):
                raise ValueError(
                    f"positions must be (i,) or (b, i), got {tuple(positions.shape)}"
                )
            check_positions(positions, (b, i), query, "query", "(b, i)")

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

    def _check_context(self, context, q: Tensor) -> None:
        """What ``attention_fn`` returned: one ``(b, h, i, d)`` tensor."""
        name = getattr(self.attention_fn, "__name__", "attention_fn")
        if not isinstance(context, Tensor):
            raise TypeError(
                f"attention_fn ({name}) must return one tensor (b, h, i, d), got "
                f"{type(context).__name__} (a kernel asked for extra outputs, such as "
                "return_lse=True, returns a tuple: leave them off)"
            )
        if context.shape != q.shape:
            raise ValueError(
                f"attention_fn ({name}) must return the shape (b, h, i, d) = "
                f"{tuple(q.shape)} of the queries, got {tuple(context.shape)}"
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
            query: ``(b, i, embed_dim)`` (``(i, b, embed_dim)`` with
                ``batch_first=False``).
            key: ``(b, j, kdim)`` (``(j, b, kdim)``).
            value: ``(b, j, vdim)`` (``(j, b, vdim)``).
            attn_mask: boolean (**True = may attend**) or float (added to the scores),
                broadcastable to ``(b, h, i, j)`` (with a cache, ``j`` counts the cached
                positions too). Not together with ``is_causal``.
            is_causal: causal masking. Without a cache it is PyTorch's top-left mask
                (query ``q`` sees keys ``k <= q``). With a cache the ``i`` queries are
                the newest positions and see every cached key plus the new keys up to
                themselves (bottom-right alignment, :meth:`KVCache.causal_pattern`).
            need_weights: also return the per-head weights, computed by
                :func:`attention.attention_weights` from the same queries, keys and mask
                (the output still comes from ``attention_fn``). Only with a softmax
                kernel (the default, or the package's reference).
            cache: a :class:`attention.KVCache` (see :meth:`new_cache`). The new keys
                and values are projected, appended to it, and the queries attend to all
                of its positions. Prefill with the prompt, then call with one token at a
                time, under ``torch.inference_mode()`` or ``torch.no_grad()``.
            positions: with ``rope``, the integer positions of the ``i`` new tokens,
                ``(i,)`` or ``(b, i)``; the keys share them. Default ``arange(i)``,
                shifted by the cache's length when a cache is given, so cached decoding
                equals the full causal call.

        Returns:
            ``(output, weights)``: output ``(b, i, embed_dim)`` (``(i, b, embed_dim)``
            with ``batch_first=False``); weights ``(b, h, i, j)`` before dropout (rows
            sum to 1) if ``need_weights`` else ``None``. ``weights.mean(1)`` is what
            ``nn.MultiheadAttention`` returns by default.
        """
        self._check_inputs(query, key, value)
        if not self.batch_first:  # (L, b, features) -> (b, L, features)
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        self._validate(
            query, key, value, attn_mask, is_causal, need_weights, cache, positions
        )
        q = _split_heads(self.w_query(query), self.num_heads)  # (b, h, i, d)
        k = _split_heads(self.w_key(key), self.num_kv_heads)  # (b, h_kv, j, d)
        v = _split_heads(self.w_value(value), self.num_kv_heads)  # (b, h_kv, j, d)
        if self.rope is not None:  # rotate queries and keys by their positions
            if positions is None:
                start = 0 if cache is None else cache.length
                positions = torch.arange(start, start + q.shape[2], device=q.device)
            elif positions.dim() == 2:
                positions = positions[:, None, :]  # (b, 1, i): the same for every head
            options = (
                self.rope.base,
                self.rope.interleaved,
                check_scaling(self.rope.scaling, self.head_dim),
            )
            q = rope_rotate(q, positions, *options)
            k = rope_rotate(k, positions, *options)
        if cache is not None:
            k, v = cache.update(k, v)  # (b, h_kv, cached + j, d)
            if is_causal:
                attn_mask, is_causal = cache.causal_pattern(q.shape[2])
        options = {"attn_mask": attn_mask, "is_causal": is_causal}
        options["enable_gqa"] = self.num_groups > 1
        if self.training and self.dropout > 0:
            options["dropout_p"] = self.dropout
        context = self.attention_fn(q, k, v, **options)  # (b, h, i, d)
        self._check_context(context, q)
        weights = None
        if need_weights:
            options.pop("dropout_p", None)
            weights = attention_weights(q, k, **options)  # (b, h, i, j)
        out = self.w_out(_merge_heads(context))  # (b, i, embed_dim): heads concatenated
        return (out if self.batch_first else out.transpose(0, 1)), weights

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of an ``nn.MultiheadAttention``'s weights in this module.

        Handles the packed ``in_proj_weight`` (``kdim = vdim = embed_dim``) and the
        separate ``q/k/v_proj_weight``, with or without bias. The result takes
        batch-first inputs whatever ``module.batch_first`` says, and boolean masks with
        True = may attend (invert the masks given to the torch module). In evaluation
        mode ``out, w = copy(q, k, v, need_weights=True)`` matches ``module``'s output
        and ``w.mean(1)`` its head-averaged weights.

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
                "add_bias_kv and add_zero_attn are not supported: the module "
                "must be built with add_bias_kv=False, add_zero_attn=False"
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
