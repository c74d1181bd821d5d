"""Single-head cross-attention: queries from one sequence, keys and values from another
(chapter 8).

Shape legend: ``b`` batch (any number of leading dims), ``i`` query positions (the
attending sequence, e.g. the decoder), ``j`` key positions (the attended context, e.g.
the encoder output), ``d`` query/key size (``d_out_kq``), ``e`` value size
(``d_out_v``).

Mask convention: boolean, **True = may attend**, broadcastable to ``(..., i, j)``, as in
``torch.nn.functional.scaled_dot_product_attention``; a float mask is added to the
scores. In an encoder-decoder the cross-attention mask is the encoder's key-padding mask
``padding_mask(src_lengths, j)[:, 0]``, shape ``(b, 1, j)``: no causal part, since the
whole source is known.

Weight convention: as in :class:`~attention.SelfAttention`, ``nn.Linear`` layers named
``w_query`` (``weight`` of shape ``(d_out_kq, d_q_in)``), ``w_key``
(``(d_out_kq, d_kv_in)``) and ``w_value`` (``(d_out_v, d_kv_in)``); a module is computed
as ``X @ W.T``. With ``d_q_in == d_kv_in`` the state dicts of the two modules are
interchangeable.
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import check_bool, check_sizes
from ..foundations.scaled_dot_product import attention_weights
from ._single_head import check_features, check_options

__all__ = ["CrossAttention"]


class CrossAttention(nn.Module):
    r"""One head of cross-attention,
    :math:`\operatorname{softmax}(Q K^\top/\sqrt{d}\,) V` with :math:`Q = X_q W_Q^\top`,
    :math:`K = X_c W_K^\top`, :math:`V = X_c W_V^\top`.

    The two sequences may differ in length (``i`` and ``j``) and in feature size
    (``d_q_in`` and ``d_kv_in``); the projections bring both to a common query/key size
    ``d``. Passing the same tensor twice is self-attention.

    Args:
        d_q_in: features of each query-side token ``x_query``.
        d_kv_in: features of each context token ``x_context``.
        d_out_kq: size ``d`` of queries and keys.
        d_out_v: size ``e`` of values, hence of each output token.
        bias: give the projections a bias (default ``False``).

    Example:
        >>> import torch
        >>> attn = CrossAttention(16, 12, 24, 28)
        >>> out, w = attn(torch.randn(6, 16), torch.randn(8, 12), need_weights=True)
        >>> out.shape, w.shape
        (torch.Size([6, 28]), torch.Size([6, 8]))
    """

    def __init__(
        self,
        d_q_in: int,
        d_kv_in: int,
        d_out_kq: int,
        d_out_v: int,
        *,
        bias: bool = False,
    ):
        super().__init__()
        self.d_q_in, self.d_kv_in, self.d_out_kq, self.d_out_v = check_sizes(
            d_q_in=d_q_in, d_kv_in=d_kv_in, d_out_kq=d_out_kq, d_out_v=d_out_v
        )
        check_bool("bias", bias)
        self.w_query = nn.Linear(self.d_q_in, self.d_out_kq, bias=bias)
        self.w_key = nn.Linear(self.d_kv_in, self.d_out_kq, bias=bias)
        self.w_value = nn.Linear(self.d_kv_in, self.d_out_v, bias=bias)

    def forward(
        self,
        x_query: Tensor,
        x_context: Tensor,
        *,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from every token of ``x_query`` to every token of ``x_context``.

        Args:
            x_query: ``(..., i, d_q_in)``, the attending sequence (e.g. decoder states).
            x_context: ``(..., j, d_kv_in)``, the attended sequence (e.g. encoder
                output); its batch dims must broadcast against those of ``x_query``.
            attn_mask: boolean (**True = may attend**) or float (added to the scores),
                broadcastable to ``(..., i, j)``; typically the context's padding mask,
                ``padding_mask(lengths, j)[:, 0]`` of shape ``(b, 1, j)`` (the
                single-head scores have no heads axis).
            need_weights: return the attention weights too.

        Returns:
            ``(output, weights)``: output ``(..., i, d_out_v)``; weights ``(..., i, j)``
            (row = query token, column = context token) with ``need_weights=True``, else
            ``None``.
        """
        check_features("x_query", x_query, self.d_q_in, "d_q_in", self.w_query)
        check_features("x_context", x_context, self.d_kv_in, "d_kv_in", self.w_key)
        check_options(x_query, x_context, attn_mask, False, need_weights)
        query = self.w_query(x_query)  # (..., i, d)
        key = self.w_key(x_context)  # (..., j, d)
        value = self.w_value(x_context)  # (..., j, e)
        weights = attention_weights(query, key, attn_mask=attn_mask)  # (..., i, j)
        return weights @ value, (weights if need_weights else None)  # (..., i, e)

    def extra_repr(self) -> str:
        return (
            f"d_q_in={self.d_q_in}, d_kv_in={self.d_kv_in}, "
            f"d_out_kq={self.d_out_kq}, d_out_v={self.d_out_v}"
        )
