r"""A Gated DeltaNet layer as Qwen3-Next builds it (chapter 12).

Shape legend: ``b`` batch, ``n`` positions, ``h`` query/key heads, ``h_v`` value heads
(a multiple of ``h``), ``d`` query/key head size, ``e`` value head size, ``K`` the width
of the short convolution, ``C = 2 h d + h_v e`` the channels it filters.

:func:`attention.gated_delta_rule_attention` is the memory; a layer needs more around
it.
Qwen3-Next's linear-attention layer (three of every four layers of the model) is, per
position ``t`` of the input ``x_t``:

1. **Projections.** :math:`q_t = W_Q x_t`, :math:`k_t = W_K x_t` (``h`` heads of size
   ``d``), :math:`v_t = W_V x_t` (``h_v`` heads of size ``e``), an output gate
   :math:`z_t = W_Z x_t` (like ``v``), and two numbers per value head,
   :math:`W_\beta x_t` and :math:`W_\Delta x_t`.
2. **A short causal convolution** of width ``K`` (4) over the ``q``, ``k`` and ``v``
   channels, each channel its own filter (depthwise), followed by SiLU: every position
   mixes in its ``K - 1`` predecessors before anything is stored.
3. **L2-normalised** :math:`q_t` and :math:`k_t` (per head,
   :math:`x / \sqrt{x \cdot x + 10^{-6}}`): with a unit key, :math:`\beta = 1`
   overwrites what the state stored under it. The query is then scaled by
   :math:`d^{-1/2}`.
4. **The step size** :math:`\beta_t = \sigma(W_\beta x_t) \in (0, 1)` and **the decay**
   :math:`g_t = -e^{a}\,\operatorname{softplus}(W_\Delta x_t + b_\Delta)` (Mamba-2's
   discretisation: a positive rate :math:`e^{a}` times a positive time step), so
   :math:`\alpha_t = e^{g_t} \in (0, 1)`. One of each per value head.
5. **The gated delta rule**, :math:`S_t = \alpha_t (I - \beta_t k_t k_t^\top) S_{t-1} +
   \beta_t k_t v_t^\top`, :math:`o_t = S_t^\top q_t`. Query/key head ``i`` serves value
   heads ``iG ... iG + G - 1`` (``G = h_v / h``, grouped value heads).
6. **A gated RMSNorm** per value head, :math:`\operatorname{RMSNorm}(o_t) \odot w \odot
   \operatorname{SiLU}(z_t)`, and the output projection :math:`W_O`.

:meth:`GatedDeltaNet.from_transformers` copies the weights of Hugging Face's
``Qwen3NextGatedDeltaNet``; the tests check the two agree in float64. Its checkpoint
names map to these: ``in_proj_qkvz`` (fused, grouped by key head) to ``w_query``,
``w_key``, ``w_value``, ``w_gate``; ``in_proj_ba`` to ``w_beta`` and ``w_time_step``;
``conv1d`` to ``conv``; ``A_log`` to ``log_decay_rate``; ``dt_bias`` to
``time_step_bias``; ``norm.weight`` to ``norm_weight``; ``out_proj`` to ``w_out``.

**State for decoding.** The layer is causal, so a sequence can be fed in pieces: with
``output_final_state=True`` it also returns ``(conv_state, memory)``, the last ``K - 1``
convolution inputs ``(b, K - 1, C)`` and the delta-rule state ``(b, h_v, d, e)``; passed
back as ``initial_state``, the next piece continues exactly (one token at a time is
cached decoding, at a constant cost per token).

**Precision.** In float16 and bfloat16 the decay, the delta rule and the norm are
computed in float32 and the result cast back, as Qwen3-Next's reference does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._checks import check_bool, check_like, check_real, check_size, check_tensor
from .delta_rule import gated_delta_rule_attention

__all__ = ["GatedDeltaNet"]

_HALF = (torch.float16, torch.bfloat16)


def _l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(x . x + eps)`` over the last dim (Qwen3-Next's and fla's spelling)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    r"""Qwen3-Next's Gated DeltaNet layer: convolution, gated delta rule, gated norm.

    The module docstring lists the six steps. Every sequence is causal: position ``t``
    sees positions ``<= t`` only (no mask argument; a padded batch needs its padding at
    the end or separate calls).

    Args:
        embed_dim: model size of the input and output.
        num_heads: ``h``, query/key heads.
        head_dim: ``d``, the query/key head size.
        num_value_heads: ``h_v``, a multiple of ``h`` (default ``h``).
        value_head_dim: ``e`` (default ``d``).
        conv_size: ``K``, the width of the causal convolution (Qwen3-Next: 4).
        norm_eps: epsilon of the gated RMSNorm.
        chunk_size: passed to :func:`attention.gated_delta_rule_attention` (64 as in
            Qwen3-Next's reference; None for the token-by-token recurrence).
        device, dtype: where and in which dtype to create the parameters.

    Submodules and parameters: ``w_query``, ``w_key`` (embed_dim -> h d), ``w_value``,
    ``w_gate`` (embed_dim -> h_v e), ``w_beta``, ``w_time_step`` (embed_dim -> h_v),
    ``conv`` (depthwise ``Conv1d`` over the ``C`` channels ``[q, k, v]``, no bias),
    ``log_decay_rate`` and ``time_step_bias`` ``(h_v,)``, ``norm_weight`` ``(e,)``,
    ``w_out`` (h_v e -> embed_dim). No biases in the projections.

    Example:
        >>> layer = GatedDeltaNet(16, num_heads=2, head_dim=4, num_value_heads=4)
        >>> x = torch.randn(2, 7, 16)
        >>> layer(x).shape
        torch.Size([2, 7, 16])
        >>> out, state = layer(x[:, :5], output_final_state=True)
        >>> rest = layer(x[:, 5:], initial_state=state)  # continues where it stopped
        >>> torch.allclose(torch.cat([out, rest], dim=1), layer(x), atol=1e-5)
        True
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        head_dim: int,
        *,
        num_value_heads: int | None = None,
        value_head_dim: int | None = None,
        conv_size: int = 4,
        norm_eps: float = 1e-6,
        chunk_size: int | None = 64,
        device=None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        embed_dim = check_size("embed_dim", embed_dim)
        h = check_size("num_heads", num_heads)
        d = check_size("head_dim", head_dim)
        h_v, e = h, d  # the defaults: one value head per query/key head, of size d
        if num_value_heads is not None:
            h_v = check_size("num_value_heads", num_value_heads)
        if value_head_dim is not None:
            e = check_size("value_head_dim", value_head_dim)
        if h_v % h:
            raise ValueError(
                f"num_value_heads must be a multiple of num_heads (each query/key head "
                f"serves a group of value heads), got {h_v} and {h}"
            )
        conv_size = check_size("conv_size", conv_size)
        if not check_real("norm_eps", norm_eps) >= 0:
            raise ValueError(f"norm_eps must be >= 0, got {norm_eps}")
        if chunk_size is not None:
            chunk_size = check_size("chunk_size", chunk_size)
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, h, d
        self.num_value_heads, self.value_head_dim = h_v, e
        self.conv_size, self.norm_eps = conv_size, float(norm_eps)
        self.chunk_size = chunk_size
        channels = 2 * h * d + h_v * e  # C: the q, k and v channels the conv filters
        fac = {"device": device, "dtype": dtype}
        self.w_query = nn.Linear(embed_dim, h * d, bias=False, **fac)
        self.w_key = nn.Linear(embed_dim, h * d, bias=False, **fac)
        self.w_value = nn.Linear(embed_dim, h_v * e, bias=False, **fac)
        self.w_gate = nn.Linear(embed_dim, h_v * e, bias=False, **fac)
        self.w_beta = nn.Linear(embed_dim, h_v, bias=False, **fac)
        self.w_time_step = nn.Linear(embed_dim, h_v, bias=False, **fac)
        self.conv = nn.Conv1d(
            channels, channels, conv_size, groups=channels, bias=False, **fac
        )
        # rates e^a in [0.01, 16] and time steps softplus(1) at the start (Qwen3-Next's
        # initialisation)
        self.log_decay_rate = nn.Parameter(
            torch.empty(h_v, **fac).uniform_(0.01, 16).log_()
        )
        self.time_step_bias = nn.Parameter(torch.ones(h_v, **fac))
        self.norm_weight = nn.Parameter(torch.ones(e, **fac))
        self.w_out = nn.Linear(h_v * e, embed_dim, bias=False, **fac)

    def extra_repr(self) -> str:
        names = (
            "embed_dim",
            "num_heads",
            "head_dim",
            "num_value_heads",
            "value_head_dim",
            "conv_size",
            "chunk_size",
        )
        return ", ".join(f"{k}={getattr(self, k)}" for k in names)

    def _validate(self, x, initial_state, output_final_state) -> None:
        check_tensor("x", x, floating=True)
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"x must have shape (b, n, embed_dim={self.embed_dim}), got "
                f"{tuple(x.shape)}"
            )
        check_like("x", x, "the module's parameters", self.w_out.weight)
        check_bool("output_final_state", output_final_state)
        if initial_state is None:
            return
        if not (isinstance(initial_state, tuple | list) and len(initial_state) == 2):
            raise TypeError(
                "initial_state must be None or the pair (conv_state, memory) "
                "returned with output_final_state=True"
            )
        b = x.shape[0]
        channels = self.conv.in_channels
        shapes = {
            "conv_state": (b, self.conv_size - 1, channels),
            "memory": (b, self.num_value_heads, self.head_dim, self.value_head_dim),
        }
        for (name, want), t in zip(shapes.items(), initial_state, strict=True):
            check_tensor(name, t, floating=True)
            check_like(name, t, "x", x)
            if tuple(t.shape) != want:
                raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")

    def forward(
        self,
        x: Tensor,
        *,
        initial_state: tuple[Tensor, Tensor] | None = None,
        output_final_state: bool = False,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """The layer applied to ``x``, causally.

        Args:
            x: ``(b, n, embed_dim)``.
            initial_state: ``(conv_state, memory)`` from an earlier call on the
                preceding positions (``(b, K - 1, C)`` and ``(b, h_v, d, e)``); None
                to start afresh (zero history).
            output_final_state: also return the state after the last position.

        Returns:
            ``(b, n, embed_dim)``; with ``output_final_state``, the pair
            ``(output, (conv_state, memory))``.
        """
        self._validate(x, initial_state, output_final_state)
        b, n, _ = x.shape
        h, d = self.num_heads, self.head_dim
        h_v, e = self.num_value_heads, self.value_head_dim
        compute = torch.float32 if x.dtype in _HALF else x.dtype

        # 1-2. projections, then the causal depthwise convolution and SiLU of q, k, v;
        # the K - 1 inputs before the first position are zeros or the cached ones
        mixed = torch.cat([self.w_query(x), self.w_key(x), self.w_value(x)], dim=-1)
        if initial_state is None:
            history = mixed.new_zeros(b, self.conv_size - 1, mixed.shape[-1])
        else:
            history = initial_state[0]  # (b, K - 1, C)
        padded = torch.cat([history, mixed], dim=1)  # (b, K - 1 + n, C)
        conv_state = padded[:, n:]  # (b, K - 1, C): the inputs the next call needs
        mixed = F.silu(self.conv(padded.transpose(1, 2))).transpose(1, 2)  # (b, n, C)
        q, k, v = mixed.split([h * d, h * d, h_v * e], dim=-1)
        q = q.reshape(b, n, h, d).transpose(1, 2).to(compute)  # (b, h, n, d)
        k = k.reshape(b, n, h, d).transpose(1, 2).to(compute)  # (b, h, n, d)
        v = v.reshape(b, n, h_v, e).transpose(1, 2).to(compute)  # (b, h_v, n, e)

        # 3. unit queries and keys, each query/key head repeated for its value heads
        group = h_v // h
        q = _l2_normalize(q).repeat_interleave(group, dim=1)  # (b, h_v, n, d)
        k = _l2_normalize(k).repeat_interleave(group, dim=1)  # (b, h_v, n, d)

        # 4. step size and decay, one per value head and position
        beta = torch.sigmoid(self.w_beta(x).to(compute)).transpose(1, 2)  # (b, h_v, n)
        step_input = self.w_time_step(x).to(compute) + self.time_step_bias.to(compute)
        time_step = F.softplus(step_input)  # (b, n, h_v), > 0
        rate = self.log_decay_rate.to(compute).exp()  # (h_v,), > 0
        g = (-rate * time_step).transpose(1, 2)  # (b, h_v, n), log alpha <= 0

        # 5. the gated delta rule (the query is scaled by d^-1/2 inside)
        memory = None if initial_state is None else initial_state[1].to(compute)
        out, memory = gated_delta_rule_attention(
            q,
            k,
            v,
            beta,
            g,
            initial_state=memory,
            output_final_state=True,
            chunk_size=self.chunk_size,
        )  # (b, h_v, n, e), (b, h_v, d, e)

        # 6. RMSNorm per value head, times the weight and the SiLU output gate
        out = out.transpose(1, 2)  # (b, n, h_v, e)
        z = self.w_gate(x).reshape(b, n, h_v, e).to(compute)  # (b, n, h_v, e)
        rms = torch.rsqrt(out.pow(2).mean(dim=-1, keepdim=True) + self.norm_eps)
        out = out * rms * self.norm_weight.to(compute) * F.silu(z)
        out = self.w_out(out.reshape(b, n, h_v * e).to(x.dtype))  # (b, n, embed_dim)
        if not output_final_state:
            return out
        return out, (conv_state, memory.to(x.dtype))

    @classmethod
    def from_transformers(
        cls, module: nn.Module, *, chunk_size: int | None = 64
    ) -> GatedDeltaNet:
        """A copy of a transformers ``Qwen3NextGatedDeltaNet`` with the same outputs.

        The fused projections are split into the learner's names (module docstring):
        ``in_proj_qkvz`` holds, for each query/key head ``i`` in turn, the rows of
        ``q_i`` (``d``), ``k_i`` (``d``), then its ``G`` value heads (``G e``) and their
        ``G`` gates (``G e``); ``in_proj_ba`` holds, per query/key head, the ``G`` beta
        rows then the ``G`` time-step rows. The copy has the module's dtype, device and
        training mode, and its RMSNorm epsilon.

        Raises:
            TypeError: ``module`` is not a ``Qwen3NextGatedDeltaNet``.
            ValueError: an activation other than SiLU, or a convolution with a bias.
        """
        from transformers.models.qwen3_next.modeling_qwen3_next import (
            Qwen3NextGatedDeltaNet,
        )

        if not isinstance(module, Qwen3NextGatedDeltaNet):
            raise TypeError(
                f"module must be a Qwen3NextGatedDeltaNet, got {type(module).__name__}"
            )
        if module.activation != "silu":
            raise ValueError(
                f"only the SiLU activation is supported, got {module.activation!r}"
            )
        if module.conv1d.bias is not None:
            raise ValueError(
                "a bias in the convolution is not supported (Qwen3-Next has none)"
            )
        h, d = module.num_k_heads, module.head_k_dim
        h_v, e = module.num_v_heads, module.head_v_dim
        group = h_v // h
        ref = module.out_proj.weight
        new = cls(
            module.hidden_size,
            h,
            d,
            num_value_heads=h_v,
            value_head_dim=e,
            conv_size=module.conv_kernel_size,
            norm_eps=module.norm.variance_epsilon,
            chunk_size=chunk_size,
            device=ref.device,
            dtype=ref.dtype,
        )
        width = module.hidden_size
        qkvz = module.in_proj_qkvz.weight.reshape(h, 2 * d + 2 * group * e, width)
        w_q, w_k, w_v, w_z = qkvz.split([d, d, group * e, group * e], dim=1)
        ba = module.in_proj_ba.weight.reshape(h, 2 * group, width)
        w_b, w_a = ba.split([group, group], dim=1)
        copies = [
            (new.w_query.weight, w_q.reshape(h * d, width)),
            (new.w_key.weight, w_k.reshape(h * d, width)),
            (new.w_value.weight, w_v.reshape(h_v * e, width)),  # value head i G + j
            (new.w_gate.weight, w_z.reshape(h_v * e, width)),
            (new.w_beta.weight, w_b.reshape(h_v, width)),
            (new.w_time_step.weight, w_a.reshape(h_v, width)),
            (new.conv.weight, module.conv1d.weight),  # (C, 1, K)
            (new.log_decay_rate, module.A_log),
            (new.time_step_bias, module.dt_bias),
            (new.norm_weight, module.norm.weight),
            (new.w_out.weight, module.out_proj.weight),
        ]
        with torch.no_grad():
            for target, source in copies:
                target.copy_(source)
        return new.train(module.training)
