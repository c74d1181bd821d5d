"""Multi-head latent attention (DeepSeek-V2/V3) and its compressed cache (chapter 18).

Shape legend: ``b`` batch, ``h`` heads, ``i`` query positions, ``j`` key positions
(cached ones included), ``n`` new positions, ``r`` = ``kv_lora_rank`` (the latent size),
``p`` = ``qk_nope_head_dim`` (the part of a query/key head without position),
``q`` = ``qk_rope_head_dim`` (the rotary part), ``e`` = ``v_head_dim``.

Multi-head attention caches ``2 * h * d`` numbers per token and layer. Multi-head latent
attention (MLA; DeepSeek-AI, 2024) caches one vector per token instead:

* a *latent* :math:`c_j = \\operatorname{RMSNorm}(W^{DKV} x_j)` of size ``r``, from
  which every head's key and value are low-rank projections,
  :math:`k^C_{j,h} = W^{UK}_h c_j` and :math:`v_{j,h} = W^{UV}_h c_j`;
* one rotary key :math:`k^R_j = \\operatorname{RoPE}_j(W^{KR} x_j)` of size ``q``,
  shared by all heads (RoPE is *decoupled*: it lives in its own few dimensions).

A head's score is
:math:`(q^C_{i,h} \\cdot k^C_{j,h} + q^R_{i,h} \\cdot k^R_j) / \\sqrt{p + q}`. Because
:math:`q^C \\cdot W^{UK} c = (W^{UK\\top} q^C) \\cdot c`, the key up-projection can be
folded into the query (and the value up-projection into the output): the *absorbed* form
attends straight from the cached latents, like multi-query attention with keys
``[c, k^R]`` of size ``r + q`` and values ``c``. RoPE must stay out of the latent: a
rotation between :math:`W^{UK}` and the dot product depends on the position ``j``, so no
single matrix could be absorbed.

Mask convention: causal masking is built in (``is_causal``); masks elsewhere in the
package are boolean with **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``.

The cache is written in place, so it is for inference: use it under
``torch.inference_mode()`` or ``torch.no_grad()``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._cache import LinearCache, buffer_kind
from .._checks import (
    check_bool,
    check_dtype,
    check_factory,
    check_int,
    check_like,
    check_real,
    check_sizes,
    check_tensor,
)
from .._rope import check_positions, check_scaling, rope_config, rope_rotate
from ..foundations.masks import decoding_mask
from ..layers.positional import RotaryConfig

__all__ = ["LatentKVCache", "MultiHeadLatentAttention"]


class LatentKVCache(LinearCache):
    """The MLA cache: per token, the latent ``c`` (``r`` values) and the rotary key.

    The rotary key holds ``q`` values.

    Nothing else is stored: one buffer of ``(b, max_len, r + q)`` whose first ``r``
    features of a row are the normalised latent of a token and whose last ``q`` are its
    rotated, head-shared key. Per token and layer that is ``r + q`` numbers, against
    ``2 * h * d`` for multi-head attention (DeepSeek-V3: 576, where 128 heads of 128
    would cache 32 768).

    Args:
        batch_size: ``b``.
        max_len: capacity in positions.
        kv_lora_rank: ``r``.
        qk_rope_head_dim: ``q``.
        dtype: element type (default ``torch.get_default_dtype()``).
        device: where the buffer lives.

    Attributes:
        buffer: ``(b, max_len, r + q)``; only ``[:, :length]`` is valid.
        length: positions stored.

    Example:
        >>> cache = LatentKVCache(2, 16, kv_lora_rank=8, qk_rope_head_dim=4,
        ...                       dtype=torch.float16)
        >>> cache.nbytes == 2 * 16 * (8 + 4) * 2
        True
    """

    def __init__(
        self,
        batch_size: int,
        max_len: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        *,
        dtype: torch.dtype | None = None,
        device=None,
    ) -> None:
        sizes = check_sizes(
            zero_ok=("qk_rope_head_dim",),
            batch_size=batch_size,
            max_len=max_len,
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=qk_rope_head_dim,
        )
        self.batch_size, self.max_len, self.kv_lora_rank, self.qk_rope_head_dim = sizes
        dtype, device = buffer_kind(dtype, device)
        width = self.kv_lora_rank + self.qk_rope_head_dim
        self.buffer = torch.zeros(
            self.batch_size, self.max_len, width, dtype=dtype, device=device
        )
        self.length = 0

    @staticmethod
    def bytes_per_token(
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        *,
        dtype: torch.dtype = torch.float16,
        num_layers: int = 1,
    ) -> int:
        """Bytes per token: ``(r + q) * bytes_per_element * num_layers``.

        Example:
            >>> # DeepSeek-V3, 16-bit
            >>> LatentKVCache.bytes_per_token(512, 64, num_layers=61)
            70272
        """
        r = check_int("kv_lora_rank", kv_lora_rank, minimum=1)
        q = check_int("qk_rope_head_dim", qk_rope_head_dim, minimum=0)
        num_layers = check_int("num_layers", num_layers, minimum=1)
        return (r + q) * check_dtype("dtype", dtype).itemsize * num_layers

    def _buffers(self) -> tuple[Tensor, ...]:
        return (self.buffer,)

    def update(self, latent: Tensor, rope_key: Tensor) -> tuple[Tensor, Tensor]:
        """Append ``n`` positions; return the latents and rotary keys of all so far.

        Args:
            latent: ``(b, n, r)`` normalised latents of the new positions.
            rope_key: ``(b, n, q)`` their rotated shared keys.

        Returns:
            ``(latents, rope_keys)``: ``(b, length, r)`` and ``(b, length, q)``, views
            into the buffer valid until the next update.
        """
        r, q = self.kv_lora_rank, self.qk_rope_head_dim
        for name, t, width in (("latent", latent, r), ("rope_key", rope_key, q)):
            check_tensor(name, t, floating=True)
            if t.dim() != 3 or t.shape[0] != self.batch_size or t.shape[2] != width:
                raise ValueError(
                    f"{name} must have shape (b, n, {width}) with "
                    f"b = {self.batch_size}, got {tuple(t.shape)}"
                )
            if t.dtype != self.dtype:
                raise TypeError(
                    f"the cache stores {self.dtype}, got {name} of dtype {t.dtype}"
                )
        n = latent.shape[1]
        if rope_key.shape[1] != n:
            raise ValueError(
                "latent and rope_key must have the same positions, got "
                f"{n} and {rope_key.shape[1]}"
            )
        self._check_fits(n)
        start, stop = self.length, self.length + n
        self.buffer[:, start:stop, :r] = latent
        self.buffer[:, start:stop, r:] = rope_key
        self.length = stop
        return self.buffer[:, :stop, :r], self.buffer[
            :, :stop, r:
        ]  # (b, j, r), (b, j, q)

    def __repr__(self) -> str:
        return (
            f"LatentKVCache(batch_size={self.batch_size}, "
            f"length={self.length}/{self.max_len}, "
            f"kv_lora_rank={self.kv_lora_rank}, "
            f"qk_rope_head_dim={self.qk_rope_head_dim}, dtype={self.dtype})"
        )


class MultiHeadLatentAttention(nn.Module):
    r"""Multi-head latent attention (MLA): low-rank keys and values, decoupled RoPE.

    Its cache holds one latent and one rotary key per token:

    .. math::
        c_j = \operatorname{RMSNorm}(W^{DKV} x_j), \quad
        k_{j,h} = [W^{UK}_h c_j,\ \operatorname{RoPE}_j(W^{KR} x_j)], \quad
        v_{j,h} = W^{UV}_h c_j, \\
        q_{i,h} = [q^C_{i,h},\ \operatorname{RoPE}_i(q^R_{i,h})], \quad
        o_i = W^O \operatorname{concat}_h \sum_j
        \operatorname{softmax}_j\Big(\frac{q_{i,h} \cdot k_{j,h}}{\sqrt{p + q}}\Big)
        v_{j,h}

    with the query either a full projection of :math:`x_i` or, with ``q_lora_rank``, a
    low-rank one through its own RMS-normalised latent.

    Args:
        embed_dim: model size of the input and output.
        num_heads: ``h``.
        kv_lora_rank: ``r``, size of the cached latent; ``r <= embed_dim`` and
            ``r <= h * (p + e)`` (a rank cannot exceed either side of the
            factorisation).
        qk_nope_head_dim: ``p``, per-head query/key size without position.
        qk_rope_head_dim: ``q``, per-head rotary size (even: RoPE rotates pairs).
        v_head_dim: ``e``, per-head value size.
        q_lora_rank: rank of the query's compression (None: a full query projection);
            ``<= embed_dim`` and ``<= h * (p + q)``.
        rope: the decoupled RoPE's options, a :class:`attention.RotaryConfig` (default
            ``RotaryConfig()``; DeepSeek's layout is ``interleaved=True``).
        norm_eps: epsilon of the two RMSNorms.
        device, dtype: where and in which dtype to create the parameters.

    Submodules: ``w_query`` (embed_dim -> h(p+q)) or ``w_query_down``
    (embed_dim -> q_lora_rank), ``query_norm``, ``w_query_up`` (q_lora_rank -> h(p+q));
    ``w_kv_down`` (embed_dim -> r+q: the latent and the rotary key), ``kv_norm``,
    ``w_kv_up`` (r -> h(p+e): per head the key rows, then the value rows), ``w_out``
    (h e -> embed_dim). No biases.

    Example:
        >>> mla = MultiHeadLatentAttention(32, 4, kv_lora_rank=8, qk_nope_head_dim=6,
        ...                                qk_rope_head_dim=4, v_head_dim=5)
        >>> x = torch.randn(2, 7, 32)
        >>> out, _ = mla(x)
        >>> out.shape
        torch.Size([2, 7, 32])
        >>> torch.allclose(mla(x, absorb=True)[0], out, atol=1e-5)
        True
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope: RotaryConfig | None = None,
        norm_eps: float = 1e-6,
        device=None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        embed_dim = check_int("embed_dim", embed_dim, minimum=1)
        h = check_int("num_heads", num_heads, minimum=1)
        r = check_int("kv_lora_rank", kv_lora_rank, minimum=1)
        p = check_int("qk_nope_head_dim", qk_nope_head_dim, minimum=1)
        q = check_int("qk_rope_head_dim", qk_rope_head_dim, minimum=2)
        e = check_int("v_head_dim", v_head_dim, minimum=1)
        if q % 2:
            raise ValueError(
                f"qk_rope_head_dim must be even (RoPE rotates pairs), got {q}"
            )
        if r > min(embed_dim, h * (p + e)):
            raise ValueError(
                "kv_lora_rank must not exceed embed_dim or num_heads * "
                "(qk_nope_head_dim + v_head_dim) (a rank cannot exceed either side), "
                f"got {r} with embed_dim={embed_dim} and {h} * ({p} + {e}) = "
                f"{h * (p + e)}"
            )
        if q_lora_rank is not None:
            q_lora_rank = check_int("q_lora_rank", q_lora_rank, minimum=1)
            if q_lora_rank > min(embed_dim, h * (p + q)):
                raise ValueError(
                    "q_lora_rank must not exceed embed_dim or num_heads * "
                    f"(qk_nope_head_dim + qk_rope_head_dim), got {q_lora_rank} with "
                    f"embed_dim={embed_dim} and {h} * ({p} + {q}) = {h * (p + q)}"
                )
        self.rope = rope_config(rope, default=RotaryConfig())
        check_scaling(self.rope.scaling, q)
        if not check_real("norm_eps", norm_eps) >= 0:
            raise ValueError(f"norm_eps must be >= 0, got {norm_eps}")

        self.embed_dim, self.num_heads, self.kv_lora_rank = embed_dim, h, r
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = p, q, e
        self.q_lora_rank = q_lora_rank
        self.norm_eps = float(norm_eps)
        self.scale = (
            p + q
        ) ** -0.5  # DeepSeek's own spelling, bit for bit (not 1 / sqrt)
        fac = check_factory(device, dtype)
        if q_lora_rank is None:
            self.w_query = nn.Linear(embed_dim, h * (p + q), bias=False, **fac)
        else:
            self.w_query_down = nn.Linear(embed_dim, q_lora_rank, bias=False, **fac)
            self.query_norm = nn.RMSNorm(q_lora_rank, eps=self.norm_eps, **fac)
            self.w_query_up = nn.Linear(q_lora_rank, h * (p + q), bias=False, **fac)
        self.w_kv_down = nn.Linear(embed_dim, r + q, bias=False, **fac)
        self.kv_norm = nn.RMSNorm(r, eps=self.norm_eps, **fac)
        self.w_kv_up = nn.Linear(r, h * (p + e), bias=False, **fac)
        self.w_out = nn.Linear(h * e, embed_dim, bias=False, **fac)

    def extra_repr(self) -> str:
        names = (
            "embed_dim",
            "num_heads",
            "kv_lora_rank",
            "q_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
        )
        extra = "" if self.rope == RotaryConfig() else f", rope={self.rope}"
        return ", ".join(f"{k}={getattr(self, k)}" for k in names) + extra

    def new_cache(
        self,
        batch_size: int,
        max_len: int,
        *,
        dtype: torch.dtype | None = None,
        device=None,
    ) -> LatentKVCache:
        """An empty :class:`LatentKVCache` for this module.

        Its dtype and device default to those of the module's weights.
        """
        weight = self.w_kv_down.weight
        return LatentKVCache(
            batch_size,
            max_len,
            self.kv_lora_rank,
            self.qk_rope_head_dim,
            dtype=weight.dtype if dtype is None else dtype,
            device=weight.device if device is None else device,
        )

    def up_projections(self) -> tuple[Tensor, Tensor]:
        """The per-head up-projections :math:`W^{UK}` and :math:`W^{UV}`.

        Shapes ``(h, p, r)`` and ``(h, e, r)``.
        """
        h, p, e, r = (
            self.num_heads,
            self.qk_nope_head_dim,
            self.v_head_dim,
            self.kv_lora_rank,
        )
        w_uk, w_uv = self.w_kv_up.weight.view(h, p + e, r).split([p, e], dim=1)
        return w_uk, w_uv

    def _validate(self, x, is_causal, positions, cache, absorb) -> None:
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"x must have shape (b, n, embed_dim={self.embed_dim}), got "
                f"{tuple(x.shape)}"
            )
        weight = self.w_kv_down.weight
        check_like("x", x, "the module's parameters", weight)
        check_bool("is_causal", is_causal)
        check_bool("absorb", absorb)
        b, n = x.shape[:2]
        if positions is not None:
            check_tensor("positions", positions)
            if tuple(positions.shape) not in ((n,), (b, n)):
                raise ValueError(
                    f"positions must have shape (n,) = ({n},) or (b, n) = ({b}, {n}), "
                    f"got {tuple(positions.shape)}"
                )
            check_positions(positions, (b, n), x, "x", "(b, n)")
        if cache is None:
            return
        if not isinstance(cache, LatentKVCache):
            raise TypeError(
                f"cache must be a LatentKVCache or None, got {type(cache).__name__}"
            )
        if (cache.kv_lora_rank, cache.qk_rope_head_dim) != (
            self.kv_lora_rank,
            self.qk_rope_head_dim,
        ):
            raise ValueError(
                f"the cache holds latents of {cache.kv_lora_rank} and rotary keys of "
                f"{cache.qk_rope_head_dim}, the module needs {self.kv_lora_rank} and "
                f"{self.qk_rope_head_dim}"
            )
        if cache.batch_size != b:
            raise ValueError(
                f"the cache was built for batch size {cache.batch_size}, got {b}"
            )
        if (cache.dtype, cache.device) != (weight.dtype, weight.device):
            raise TypeError(
                f"the cache stores {cache.dtype} on {cache.device}, the module "
                f"computes in {weight.dtype} on {weight.device}"
            )
        cache._check_fits(n)

    def forward(
        self,
        x: Tensor,
        *,
        is_causal: bool = True,
        positions: Tensor | None = None,
        cache: LatentKVCache | None = None,
        absorb: bool = False,
    ) -> tuple[Tensor, None]:
        """Self-attention of ``x`` (and of the cached positions).

        Args:
            x: ``(b, n, embed_dim)``.
            is_causal: each position sees the positions up to itself (with a cache:
                every cached position plus the new ones up to itself); False: every
                position.
            positions: ``(n,)`` or ``(b, n)`` integer positions for RoPE; default
                ``arange(n)``, or ``cache.length + arange(n)`` with a cache.
            cache: a :class:`LatentKVCache` (:meth:`new_cache`): the new latents and
                rotary keys are appended and the queries attend to all stored positions.
            absorb: attend from the latents directly, with :math:`W^{UK}` folded into
                the queries and :math:`W^{UV}` applied after the weighted sum; equal to
                the materialised keys and values (False), without ever forming them.

        Returns:
            ``(output, None)``: output ``(b, n, embed_dim)``.
        """
        self._validate(x, is_causal, positions, cache, absorb)
        b, n, _ = x.shape
        h, p, q, r = (
            self.num_heads,
            self.qk_nope_head_dim,
            self.qk_rope_head_dim,
            self.kv_lora_rank,
        )
        num_cached = 0 if cache is None else cache.length
        if positions is None:
            positions = torch.arange(
                num_cached, num_cached + n, device=x.device
            )  # (n,)
        rope = (
            self.rope.base,
            self.rope.interleaved,
            check_scaling(self.rope.scaling, q),
        )
        head_pos = (
            positions if positions.dim() == 1 else positions[:, None]
        )  # (n,) or (b, 1, n)

        if self.q_lora_rank is None:
            query = self.w_query(x)  # (b, n, h(p+q))
        else:
            query = self.w_query_up(self.query_norm(self.w_query_down(x)))
        query = query.view(b, n, h, p + q).transpose(1, 2)  # (b, h, n, p+q)
        q_nope, q_rope = query.split([p, q], dim=-1)  # (b, h, n, p), (b, h, n, q)
        q_rope = rope_rotate(q_rope, head_pos, *rope)

        latent, k_rope = self.w_kv_down(x).split([r, q], dim=-1)  # (b, n, r), (b, n, q)
        latent = self.kv_norm(latent)
        k_rope = rope_rotate(k_rope, positions, *rope)  # (b, n, q)
        if cache is not None:
            latent, k_rope = cache.update(latent, k_rope)  # (b, j, r), (b, j, q)
        j = latent.shape[1]

        # bottom-right causal: the new queries see every cached position (none needed
        # for n = 1)
        causal = is_causal and n > 1
        attn_mask = (
            decoding_mask(n, num_cached, device=x.device) if causal else None
        )  # (i, j)

        w_uk, w_uv = self.up_projections()  # (h, p, r), (h, e, r)
        if absorb:
            # q^C . (W^UK c) = (W^UK^T q^C) . c: every head reads the same key [c, k^R]
            # and the latent c as its value, so the h heads are stacked as the h * n
            # query rows of one single-head attention (no copy of the cache per head).
            query = torch.cat([q_nope @ w_uk, q_rope], dim=-1)  # (b, h, n, r+q)
            key = torch.cat([latent, k_rope], dim=-1)[:, None]  # (b, 1, j, r+q)
            mask = None if attn_mask is None else attn_mask.repeat(h, 1)  # (h n, j)
            context = F.scaled_dot_product_attention(
                query.reshape(b, 1, h * n, r + q),
                key,
                latent[:, None],
                attn_mask=mask,
                scale=self.scale,
            )  # (b, 1, h n, r)
            context = context.view(b, h, n, r) @ w_uv.transpose(-2, -1)  # (b, h, n, e)
        else:
            k_nope = torch.einsum("bjr,hpr->bhjp", latent, w_uk)  # (b, h, j, p)
            value = torch.einsum("bjr,her->bhje", latent, w_uv)  # (b, h, j, e)
            key = torch.cat(
                [k_nope, k_rope[:, None].expand(b, h, j, q)], dim=-1
            )  # (b, h, j, p+q)
            query = torch.cat([q_nope, q_rope], dim=-1)  # (b, h, n, p+q)
            top_left = (
                causal and num_cached == 0
            )  # torch's fused kernel skips masked tiles
            context = F.scaled_dot_product_attention(
                query,
                key,
                value,
                attn_mask=None if top_left else attn_mask,
                is_causal=top_left,
                scale=self.scale,
            )  # (b, h, n, e)
        out = context.transpose(1, 2).reshape(b, n, h * self.v_head_dim)  # (b, n, h e)
        return self.w_out(out), None

    @classmethod
    def from_transformers(cls, module: nn.Module) -> MultiHeadLatentAttention:
        """A copy of a transformers ``DeepseekV3Attention`` with the same outputs.

        ``rope.interleaved`` comes from ``config.rope_interleave``, ``rope.base`` from
        ``config.rope_parameters["rope_theta"]`` and ``norm_eps`` from the module's
        latent RMSNorm. The copy has the module's device, dtype and training mode. (Its
        attention has no dropout: with ``config.attention_dropout > 0`` the two agree in
        eval mode.)

        Raises:
            ValueError: for a rope type other than ``"default"`` (YaRN and the other
                scalings change the angles and the scale), attention biases, or
                ``num_key_value_heads != num_attention_heads``.
        """
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3Attention,
        )

        if not isinstance(module, DeepseekV3Attention):
            raise TypeError(
                f"module must be a DeepseekV3Attention, got {type(module).__name__}"
            )
        config: Any = module.config  # a transformers DeepseekV3Config
        rope_parameters = dict(getattr(config, "rope_parameters", None) or {})
        rope_type = rope_parameters.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(
                f"only the default RoPE is supported, got rope_type={rope_type!r} "
                "(its angles and attention scale differ)"
            )
        if config.attention_bias or any(
            getattr(layer, "bias", None) is not None
            for layer in (module.q_a_proj, module.kv_a_proj_with_mqa, module.o_proj)
        ):
            raise ValueError(
                "attention biases are not supported (config.attention_bias=True)"
            )
        if config.num_key_value_heads != config.num_attention_heads:
            raise ValueError(
                "num_key_value_heads must equal num_attention_heads, got "
                f"{config.num_key_value_heads} and {config.num_attention_heads}"
            )
        eps = module.kv_a_layernorm.variance_epsilon
        if (
            module.q_a_layernorm is not None
            and module.q_a_layernorm.variance_epsilon != eps
        ):
            raise ValueError(
                "the two latent RMSNorms must share their epsilon, got "
                f"{module.q_a_layernorm.variance_epsilon} and {eps}"
            )
        ref = module.o_proj.weight
        new = cls(
            config.hidden_size,
            config.num_attention_heads,
            kv_lora_rank=config.kv_lora_rank,
            qk_nope_head_dim=config.qk_nope_head_dim,
            qk_rope_head_dim=config.qk_rope_head_dim,
            v_head_dim=config.v_head_dim,
            q_lora_rank=config.q_lora_rank,
            rope=RotaryConfig(
                base=float(rope_parameters.get("rope_theta", 10000.0)),
                interleaved=bool(config.rope_interleave),
            ),
            norm_eps=float(eps),
            device=ref.device,
            dtype=ref.dtype,
        )
        names = {
            "w_kv_down": "kv_a_proj_with_mqa",
            "kv_norm": "kv_a_layernorm",
            "w_kv_up": "kv_b_proj",
            "w_out": "o_proj",
        }
        if config.q_lora_rank is None:
            names["w_query"] = "q_proj"
        else:
            names.update(
                w_query_down="q_a_proj",
                query_norm="q_a_layernorm",
                w_query_up="q_b_proj",
            )
        with torch.no_grad():
            for ours, theirs in names.items():
                getattr(new, ours).weight.copy_(getattr(module, theirs).weight)
        new.train(module.training)
        return new
