"""Additive attention layers (taught in chapter 9).

Two complete attention layers built on the additive score of ``scoring.py``,
:math:`\\mathrm{act}(W_1 q + W_2 k + b)`:

- :class:`AdditiveAttention` (Bahdanau et al., 2015): one score per key,
  :math:`v^\\top \\tanh(W_1 q_i + W_2 k_j + b)`, softmax over the keys, weighted sum of
  the values.
- :class:`MultiDimensionalAttention` (Shen et al., 2018, DiSAN): one score per key *per
  value feature*, a softmax over the keys for each feature, values weighted element-wise
  (functional pieces: :func:`multidimensional_scores`, :func:`multidimensional_weights`,
  :func:`multidimensional_attention`).

Shape legend: ``b`` batch (any number of leading dims ``...``), ``i`` query positions,
``j`` key positions, ``d_q`` query size, ``d_k`` key size, ``a`` hidden size of the
additive score (``d_hidden``), ``e`` value size (= number of features ``f`` in the
multi-dimensional case).

Mask convention: boolean, **True = may attend**, broadcastable to ``(b, j)`` for a
single query or ``(b, i, j)`` for a sequence (as in
``torch.nn.functional.scaled_dot_product_attention``); a float mask is added to the
scores. A query with no visible key gets zero weights and a zero context.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import (
    broadcast_shapes,
    check_int,
    check_like,
    check_mask,
    check_sizes,
    check_tensor,
    check_value,
)
from .._core import masked_softmax
from ._scoring import additive_hidden_core, check_feature_sizes, check_param
from .scoring import AdditiveScore, additive_hidden, get_activation

# The facade re-exports the library names (the first 2); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "AdditiveAttention",
    "MultiDimensionalAttention",
    "multidimensional_weights",
]


def _attention_inputs(
    query, key, value, attn_mask, *, d_q: int, d_k: int, d_v: int | None, weight: Tensor
) -> tuple[Tensor, Tensor, Tensor | None, bool]:
    """Shared boundary checks of the additive attention modules.

    ``query`` is ``(b, d_q)`` (one query per batch element) or ``(b, i, d_q)``; ``key``
    ``(b, j, d_k)``; ``value`` ``(b, j, e)`` or None for the keys; ``attn_mask``
    broadcastable to ``(b, j)`` or ``(b, i, j)``; every tensor has the dtype and device
    of the module's ``weight``. Returns ``(query, value, attn_mask, single)`` with a
    single query turned into a sequence of one, ``(b, 1, d_q)``, and its mask into
    ``(b, 1, j)``.
    """
    check_tensor("query", query, floating=True, min_dim=2)
    check_tensor("key", key, floating=True, min_dim=3)
    value = key if value is None else value
    check_value(value, key.shape[-2], "query", query, min_dim=3)
    if d_v is not None and value.shape[-1] != d_v:
        raise ValueError(
            f"value must have d_v = {d_v} features (its last dimension), "
            f"got {value.shape[-1]}"
        )
    single = query.dim() == key.dim() - 1
    if single:
        query = query.unsqueeze(-2)  # (b, 1, d_q)
    check_feature_sizes(query, key, d_q, d_k)
    check_like("query", query, "the module's parameters", weight)
    batch = broadcast_shapes(
        "the batch dims of query, key and value",
        query.shape[:-2],
        key.shape[:-2],
        value.shape[:-2],
    )
    if attn_mask is not None:
        i = () if single else (query.shape[-2],)
        check_mask(
            attn_mask, query.dtype, (*batch, *i, key.shape[-2]), device=query.device
        )
        if single:
            attn_mask = attn_mask.unsqueeze(-2)  # (b, 1, j)
    return query, value, attn_mask, single


def _hidden_inputs(
    score, query, key, value, attn_mask, *, d_v: int | None, weight: Tensor
) -> tuple[Tensor, Tensor, Tensor | None, bool]:
    """:func:`_attention_inputs`, then the ``(b, i, j, a)`` hidden layer of ``score`` (a
    module with ``d_q``, ``d_k``, ``w_query``, ``w_key``, ``bias`` and ``activation``).

    Returns ``(hidden, value, attn_mask, single)``.
    """
    query, value, attn_mask, single = _attention_inputs(
        query,
        key,
        value,
        attn_mask,
        d_q=score.d_q,
        d_k=score.d_k,
        d_v=d_v,
        weight=weight,
    )
    act = get_activation(score.activation)
    hidden = additive_hidden_core(
        query, key, score.w_query, score.w_key, score.bias, act
    )
    return hidden, value, attn_mask, single


class AdditiveAttention(nn.Module):
    r"""Bahdanau attention: additive scores, softmax over keys, weighted sum of values.

    .. math::

        \alpha_{ij} = \operatorname{softmax}_j
        \big(v^\top \tanh(W_1 q_i + W_2 k_j + b)\big),
        \qquad c_i = \sum_j \alpha_{ij} v_j

    The query may be a single vector per batch element (a decoder state, ``(b, d_q)``)
    or a sequence ``(b, i, d_q)``; keys and values may have other sizes than the query.

    Args:
        d_q: query size.
        d_k: key size.
        d_v: value size, checked when given (values are not projected); None accepts
            any.
        d_hidden: hidden size ``a`` of the score (default ``d_q``).
        activation: activation of the score (default ``"tanh"``).
        bias: include the bias :math:`b` in the score.

    Parameters: those of :attr:`score`, an :class:`AdditiveScore`.

    Example:
        >>> attn = AdditiveAttention(4, 6, 3, d_hidden=8)
        >>> query, key = torch.randn(2, 4), torch.randn(2, 5, 6)
        >>> context, weights = attn(query, key, torch.randn(2, 5, 3))
        >>> context.shape, weights.shape
        (torch.Size([2, 3]), torch.Size([2, 5]))
    """

    def __init__(
        self,
        d_q: int,
        d_k: int,
        d_v: int | None = None,
        d_hidden: int | None = None,
        *,
        activation: str | None = "tanh",
        bias: bool = True,
    ):
        super().__init__()
        self.d_v = None if d_v is None else check_int("d_v", d_v, minimum=1)
        d_hidden = d_q if d_hidden is None else d_hidden
        self.score = AdditiveScore(d_q, d_k, d_hidden, activation, bias=bias)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend from ``query`` over ``key``/``value``.

        Args:
            query: ``(b, d_q)`` (one query each) or ``(b, i, d_q)``.
            key: ``(b, j, d_k)``.
            value: ``(b, j, e)``; None uses the keys as values (Bahdanau's annotations).
            attn_mask: boolean, **True = may attend**, broadcastable to the weights'
                shape: ``(b, j)`` for a single query, ``(b, i, j)`` for a sequence.
                A float mask is added to the scores.

        Returns:
            ``(context, weights)``: ``(b, e)`` and ``(b, j)`` for a single query,
            ``(b, i, e)`` and ``(b, i, j)`` for a sequence. Masked weights are exactly
            zero; a query with no visible key gets zero weights and a zero context.
        """
        hidden, value, attn_mask, single = _hidden_inputs(
            self.score, query, key, value, attn_mask, d_v=self.d_v, weight=self.score.v
        )
        weights = masked_softmax(hidden @ self.score.v, attn_mask)  # (b, i, j)
        context = weights @ value  # (b, i, e)
        if single:
            return context.squeeze(-2), weights.squeeze(-2)
        return context, weights


def multidimensional_scores(
    query: Tensor,
    key: Tensor,
    w_query: Tensor,
    w_key: Tensor,
    w_out: Tensor,
    bias: Tensor | None = None,
    out_bias: Tensor | None = None,
    activation: str | None = "tanh",
) -> Tensor:
    r"""A score per key *per feature*:
    :math:`s_{ij} = W_o\,\mathrm{act}(W_1 q_i + W_2 k_j + b) + b_o \in \mathbb{R}^{f}`.

    The additive score with its output vector :math:`v` replaced by a matrix
    :math:`W_o` of ``f`` rows (Shen et al., 2018).

    Args:
        query: ``(..., i, d_q)``; key: ``(..., j, d_k)``.
        w_query: ``(a, d_q)``; w_key: ``(a, d_k)``; w_out: ``(f, a)``.
        bias: ``(a,)`` or None; out_bias: ``(f,)`` or None.
        activation: name of the activation (default ``"tanh"``).

    Returns:
        ``(..., i, j, f)`` scores.

    Example:
        >>> w = torch.zeros(4, 3)
        >>> query, key, w_out = torch.ones(2, 3), torch.ones(5, 3), torch.zeros(6, 4)
        >>> multidimensional_scores(query, key, w, w, w_out).shape
        torch.Size([2, 5, 6])
    """
    check_tensor("w_out", w_out, floating=True)
    check_tensor("w_query", w_query, floating=True, min_dim=1)
    if w_out.dim() != 2 or w_out.shape[1] != w_query.shape[0]:
        raise ValueError(
            f"w_out must be (f, a) with a = {w_query.shape[0]}, "
            f"got shape {tuple(w_out.shape)}"
        )
    check_like("w_out", w_out, "w_query", w_query)
    if out_bias is not None:
        check_param("out_bias", out_bias, (w_out.shape[0],), "(f,)", w_out)
    hidden = additive_hidden(
        query, key, w_query, w_key, bias, activation
    )  # (..., i, j, a)
    scores = hidden @ w_out.transpose(0, 1)  # (..., i, j, f)
    return scores if out_bias is None else scores + out_bias


def multidimensional_weights(
    scores: Tensor, *, attn_mask: Tensor | None = None
) -> Tensor:
    r"""Softmax over the keys separately for every feature:
    :math:`\alpha_{ijc} = \operatorname{softmax}_j(s_{ijc})`.

    Args:
        scores: ``(..., i, j, f)``.
        attn_mask: boolean (**True = may attend**) or float, broadcastable to
            ``(..., i, j)``; the same for every feature.

    Returns:
        ``(..., i, j, f)`` weights; for every query and feature they sum to 1 over ``j``
        (0 for a query with no visible key).

    Example:
        >>> multidimensional_weights(torch.zeros(1, 2, 3)).sum(-2).tolist()
        [[1.0, 1.0, 1.0]]
    """
    check_tensor("scores", scores, floating=True, min_dim=3)
    if attn_mask is not None:
        check_mask(
            attn_mask, scores.dtype, tuple(scores.shape[:-1]), device=scores.device
        )
        attn_mask = attn_mask.unsqueeze(-1)  # (..., i, j, 1)
    return masked_softmax(scores, attn_mask, dim=-2)  # (..., i, j, f)


def _check_feature_values(weights: Tensor, value) -> None:
    check_tensor("weights", weights, floating=True, min_dim=3)
    check_value(value, weights.shape[-2], "weights", weights)
    if value.shape[-1] != weights.shape[-1]:
        raise ValueError(
            "value must have one feature per weight feature: e = "
            f"{weights.shape[-1]}, got {value.shape[-1]}"
        )
    broadcast_shapes(
        "the batch dims of weights and value", weights.shape[:-3], value.shape[:-2]
    )


def multidimensional_attention(weights: Tensor, value: Tensor) -> Tensor:
    r"""Element-wise weighting of the values:
    :math:`c_{ic} = \sum_j \alpha_{ijc} v_{jc}`.

    Args:
        weights: ``(..., i, j, e)``.
        value: ``(..., j, e)``.

    Returns:
        ``(..., i, e)`` context.

    Example:
        >>> weights = torch.full((1, 2, 3), 0.5)
        >>> multidimensional_attention(weights, torch.ones(2, 3)).tolist()
        [[1.0, 1.0, 1.0]]
    """
    _check_feature_values(weights, value)
    return (weights * value.unsqueeze(-3)).sum(dim=-2)  # (..., i, e)


class MultiDimensionalAttention(nn.Module):
    r"""Multi-dimensional (feature-wise) additive attention (Shen et al., 2018).

    Each key gets ``d_v`` scores, one per value feature; the softmax over keys is taken
    per feature and the values are weighted element-wise, so different features of the
    context may come from different keys.

    Parameters:
        w_query: ``(d_hidden, d_q)``; w_key: ``(d_hidden, d_k)``; bias: ``(d_hidden,)``;
        w_out: ``(d_v, d_hidden)``; out_bias: ``(d_v,)``.

    Args:
        d_q, d_k, d_v: query, key and value sizes.
        d_hidden: hidden size ``a``.
        activation: activation of the hidden layer (default ``"tanh"``).

    Call ``attn(query, key, value=None, *, attn_mask=None) -> (context, weights)`` with
    query ``(b, d_q)`` or ``(b, i, d_q)``, key ``(b, j, d_k)``, value ``(b, j, d_v)``
    (the keys when None, then ``d_v`` must equal ``d_k``); context ``(b, d_v)`` /
    ``(b, i, d_v)``, weights ``(b, j, d_v)`` / ``(b, i, j, d_v)``. The mask (**True =
    may attend**) broadcasts to ``(b, j)`` / ``(b, i, j)``.

    Example:
        >>> attn = MultiDimensionalAttention(4, 4, 3, 8)
        >>> query, key = torch.randn(2, 4), torch.randn(2, 5, 4)
        >>> context, weights = attn(query, key, torch.randn(2, 5, 3))
        >>> context.shape, weights.shape
        (torch.Size([2, 3]), torch.Size([2, 5, 3]))
    """

    def __init__(
        self,
        d_q: int,
        d_k: int,
        d_v: int,
        d_hidden: int,
        *,
        activation: str | None = "tanh",
    ):
        super().__init__()
        self.d_q, self.d_k, self.d_v, self.d_hidden = check_sizes(
            d_q=d_q, d_k=d_k, d_v=d_v, d_hidden=d_hidden
        )
        get_activation(activation)
        self.activation = activation
        self.w_query = nn.Parameter(torch.empty(self.d_hidden, self.d_q))
        self.w_key = nn.Parameter(torch.empty(self.d_hidden, self.d_k))
        self.bias = nn.Parameter(torch.empty(self.d_hidden))
        self.w_out = nn.Parameter(torch.empty(self.d_v, self.d_hidden))
        self.out_bias = nn.Parameter(torch.empty(self.d_v))
        for p, fan_in in (
            (self.w_query, self.d_q),
            (self.w_key, self.d_k),
            (self.bias, self.d_hidden),
            (self.w_out, self.d_hidden),
            (self.out_bias, self.d_hidden),
        ):
            nn.init.uniform_(p, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        hidden, value, attn_mask, single = _hidden_inputs(
            self, query, key, value, attn_mask, d_v=self.d_v, weight=self.w_query
        )  # (b, i, j, a)
        scores = hidden @ self.w_out.transpose(0, 1) + self.out_bias  # (b, i, j, d_v)
        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(-1)  # (b, i, j, 1)
        weights = masked_softmax(scores, attn_mask, dim=-2)  # (b, i, j, d_v)
        context = (weights * value.unsqueeze(-3)).sum(dim=-2)  # (b, i, d_v)
        if single:
            return context.squeeze(-2), weights.squeeze(-3)
        return context, weights
