"""Single-head self-attention with learned projections (chapter 5).

Shape legend: ``b`` batch (any number of leading dims), ``i`` query positions, ``j`` key
positions (``i = j`` in self-attention), ``d`` query/key size (``d_out_kq``), ``e``
value size (``d_out_v``).

Mask convention: boolean, **True = may attend**, broadcastable to ``(..., i, j)``, as in
``torch.nn.functional.scaled_dot_product_attention``; a float mask is added to the
scores.

Weight convention: the projections are ``nn.Linear`` layers named ``w_query``, ``w_key``
and ``w_value``. ``w_query.weight`` has shape ``(d_out_kq, d_in)``: it *is* the matrix
:math:`W_Q` of the step-by-step walk-through, which computes ``q = W_Q @ x`` for one
token ``x``; for a whole sequence ``X`` of shape ``(i, d_in)`` the layer computes
``X @ W_Q.T`` (+ bias), the paper's ``X W`` with ``W = W_Q.T``. Copying a walk-through
matrix into the module is therefore ``module.w_query.weight.copy_(W_query)``.
"""

from __future__ import annotations

from torch import Tensor, nn

from .._checks import check_bool, check_sizes
from ..foundations.scaled_dot_product import attention_weights
from ._single_head import check_features, check_options

__all__ = ["SelfAttention"]


class SelfAttention(nn.Module):
    r"""One head of self-attention:
    :math:`\operatorname{softmax}(Q K^\top/\sqrt{d}\,) V` with :math:`Q = X W_Q^\top`,
    :math:`K = X W_K^\top`, :math:`V = X W_V^\top`.

    The module owns only the three projections; the attention itself is the package's
    functional :func:`~attention.attention_weights` (the weights of
    :func:`~attention.scaled_dot_product_attention`) times the values.

    Args:
        d_in: features of each input token.
        d_out_kq: size ``d`` of queries and keys (the scores are scaled by
            :math:`1/\sqrt{d}`).
        d_out_v: size ``e`` of values, hence of each output token.
        bias: give the projections a bias (default ``False``, as in the walk-through).

    Attributes:
        w_query: ``nn.Linear(d_in, d_out_kq)``; ``w_query.weight`` is
            ``(d_out_kq, d_in)``.
        w_key: ``nn.Linear(d_in, d_out_kq)``.
        w_value: ``nn.Linear(d_in, d_out_v)``.

    Example:
        >>> import torch
        >>> attn = SelfAttention(16, 24, 28)
        >>> out, w = attn(torch.randn(6, 16))
        >>> out.shape, w is None
        (torch.Size([6, 28]), True)
        >>> out, w = attn(torch.randn(2, 6, 16), is_causal=True, need_weights=True)
        >>> out.shape, w.shape
        (torch.Size([2, 6, 28]), torch.Size([2, 6, 6]))
    """

    def __init__(self, d_in: int, d_out_kq: int, d_out_v: int, *, bias: bool = False):
        super().__init__()
        self.d_in, self.d_out_kq, self.d_out_v = check_sizes(
            d_in=d_in, d_out_kq=d_out_kq, d_out_v=d_out_v
        )
        check_bool("bias", bias)
        self.w_query = nn.Linear(self.d_in, self.d_out_kq, bias=bias)
        self.w_key = nn.Linear(self.d_in, self.d_out_kq, bias=bias)
        self.w_value = nn.Linear(self.d_in, self.d_out_v, bias=bias)

    def forward(
        self,
        x: Tensor,
        *,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from every token of ``x`` to every token of ``x``.

        Args:
            x: ``(..., i, d_in)`` input tokens.
            attn_mask: boolean (**True = may attend**) or float (added to the scores),
                broadcastable to ``(..., i, i)``. The scores of this single head have no
                heads axis, so a key-padding mask from ``padding_mask(lengths, i)``,
                shaped ``(b, 1, 1, i)`` for multi-head scores, is passed as
                ``mask[:, 0]``, ``(b, 1, i)``.
            is_causal: token ``q`` sees only tokens ``k <= q``; not together with
                ``attn_mask``.
            need_weights: return the attention weights too.

        Returns:
            ``(output, weights)``: output ``(..., i, d_out_v)``; weights ``(..., i, i)``
            (rows = queries) with ``need_weights=True``, else ``None``.
        """
        check_features("x", x, self.d_in, "d_in", self.w_query)
        check_options(x, x, attn_mask, is_causal, need_weights)
        query = self.w_query(x)  # (..., i, d)
        key = self.w_key(x)  # (..., i, d)
        value = self.w_value(x)  # (..., i, e)
        weights = attention_weights(
            query, key, attn_mask=attn_mask, is_causal=is_causal
        )  # (..., i, i): softmax(q·kᵀ/√d) with the mask
        return weights @ value, (weights if need_weights else None)  # (..., i, e)

    def extra_repr(self) -> str:
        return f"d_in={self.d_in}, d_out_kq={self.d_out_kq}, d_out_v={self.d_out_v}"
