"""Alignment: how scores become weights, and how many weights per key (taught in chapter 09).

Shape legend: ``b`` batch (any number of leading dims ``...``), ``i`` query positions,
``j`` key positions (``S`` of them, the source length), ``d_q`` query size, ``d_k`` key
size, ``a`` hidden size of an additive score (``d_hidden``), ``e`` value size (= number
of features ``f`` in the multi-dimensional case); draws of hard attention stack on a
leading ``num_samples`` axis.

- **soft / global** (:func:`soft_alignment`): softmax over all keys; differentiable.
- **hard** (:func:`hard_alignment`, :func:`hard_attention`): sample one key per query
  from the soft weights (Xu et al., 2015); the output is one value vector, an unbiased
  but noisy estimate of the soft context, and not differentiable in the weights.
- **local** (:func:`local_alignment`, :class:`LocalAlignment`): predict a centre
  ``p = S * sigmoid(v_p^T tanh(W_p q))``, keep the keys of the window
  ``[p - D, p + D]`` and weigh them by ``softmax`` restricted to the window times a
  Gaussian ``exp(-(l - p)^2 / (2 sigma^2))``, ``sigma = D / 2`` (Luong et al., 2015).
- **multi-dimensional** (:func:`multidimensional_weights`, :class:`MultiDimensionalAttention`):
  one score per key *per feature*, softmax over keys for each feature, values weighted
  element-wise (Shen et al., 2018, DiSAN).

Mask convention: boolean, **True = may attend**, broadcastable to the ``(..., i, j)``
weights (as in ``torch.nn.functional.scaled_dot_product_attention``); a float mask is
added to the scores. A query with no visible key gets all-zero weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ._checks import (
    broadcast_shapes,
    check_generator,
    check_int,
    check_like,
    check_mask,
    check_real,
    check_tensor,
    check_value,
)
from ._core import masked_softmax
from .scoring import (
    _additive_hidden,
    _attention_inputs,
    _check_param,
    additive_hidden,
    get_activation,
)

# The functions are imported from this module (``from attention.alignment import
# soft_alignment``); the facade exports the mechanisms.
__all__ = ["hard_attention", "LocalAlignment", "MultiDimensionalAttention"]


# --------------------------------------------------------------------------- soft


def soft_alignment(scores: Tensor, *, attn_mask: Tensor | None = None) -> Tensor:
    r"""Soft (global) alignment: :math:`\alpha_{ij} = \operatorname{softmax}_j(s_{ij})` over the visible keys.

    Args:
        scores: ``(..., i, j)`` from any score function.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., i, j)``.

    Returns:
        ``(..., i, j)`` weights: rows sum to 1, masked entries are exactly 0, a row with
        no visible key is all zeros.

    Example:
        >>> soft_alignment(torch.zeros(1, 3), attn_mask=torch.tensor([[True, True, False]])).tolist()
        [[0.5, 0.5, 0.0]]
    """
    check_tensor("scores", scores, floating=True, min_dim=2)
    if attn_mask is not None:
        check_mask(attn_mask, scores.dtype, tuple(scores.shape), device=scores.device)
    return masked_softmax(scores, attn_mask)


def _check_value(weights: Tensor, value) -> None:
    """value ``(..., j, e)`` matching the ``(..., i, j)`` weights (dtype, device, j, batch)."""
    check_value(value, weights.shape[-1], "weights", weights)
    broadcast_shapes("the batch dims of weights and value", weights.shape[:-2], value.shape[:-2])


def soft_attention(
    scores: Tensor, value: Tensor, *, attn_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r"""Soft attention :math:`c_i = \sum_j \alpha_{ij} v_j` with :math:`\alpha = ` :func:`soft_alignment`.

    Args:
        scores: ``(..., i, j)``.
        value: ``(..., j, e)``.
        attn_mask: boolean (**True = may attend**) or float, broadcastable to ``(..., i, j)``.

    Returns:
        ``(context, weights)``: ``(..., i, e)`` and ``(..., i, j)``.

    Example:
        >>> context, _ = soft_attention(torch.zeros(1, 2), torch.tensor([[0.0], [2.0]]))
        >>> context.tolist()
        [[1.0]]
    """
    check_tensor("scores", scores, floating=True, min_dim=2)
    _check_value(scores, value)
    weights = soft_alignment(scores, attn_mask=attn_mask)
    return weights @ value, weights  # (..., i, e), (..., i, j)


# --------------------------------------------------------------------------- hard


def hard_alignment(
    weights: Tensor,
    *,
    generator: torch.Generator | None = None,
    num_samples: int | None = None,
) -> Tensor:
    r"""Hard alignment: sample one key index :math:`s_i \sim \operatorname{Categorical}(\alpha_{i\cdot})` per query.

    Args:
        weights: ``(..., i, j)`` non-negative weights (e.g. from :func:`soft_alignment`);
            each row is normalised before sampling. A row of zeros (no visible key)
            gets the index ``-1``.
        generator: a ``torch.Generator`` for reproducible draws.
        num_samples: None for one draw, or the number of independent draws stacked in front.

    Returns:
        ``(..., i)`` integer indices, or ``(num_samples, ..., i)``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> hard_alignment(torch.tensor([[0.0, 1.0, 0.0]]), generator=g).tolist()
        [1]
    """
    check_tensor("weights", weights, floating=True, min_dim=1)
    if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
        raise ValueError("weights must be finite and >= 0 to be sampled from")
    n = 1 if num_samples is None else check_int("num_samples", num_samples, minimum=1)
    check_generator(generator, weights.device)
    j = weights.shape[-1]
    flat = weights.detach().reshape(weights.shape[:-1].numel(), j)  # (rows, j)
    dead = flat.sum(-1) == 0  # (rows,): no visible key (every row when j = 0)
    if bool(dead.all()):  # nothing to draw from; multinomial refuses empty inputs
        idx = torch.full((flat.shape[0], n), -1, dtype=torch.long, device=weights.device)
    else:
        safe = torch.where(dead.unsqueeze(-1), torch.ones_like(flat), flat)
        idx = torch.multinomial(safe, n, replacement=True, generator=generator)  # (rows, n)
        idx = idx.masked_fill(dead.unsqueeze(-1), -1)
    idx = idx.transpose(0, 1).reshape(n, *weights.shape[:-1])  # (num_samples, ..., i)
    return idx[0] if num_samples is None else idx


def hard_attention(
    weights: Tensor,
    value: Tensor,
    *,
    generator: torch.Generator | None = None,
    num_samples: int | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Hard attention: the context is the one value vector at a sampled position.

    :math:`c_i = v_{s_i}` with :math:`s_i \sim \alpha_{i\cdot}`, so
    :math:`\mathbb{E}[c_i] = \sum_j \alpha_{ij} v_j`, the soft context (Xu et al., 2015).
    The estimate is unbiased; its variance
    :math:`\sum_j \alpha_{ij} \lVert v_j - c_i^{\text{soft}}\rVert^2` shrinks as
    :math:`1/N` when ``N`` draws are averaged. Sampling has no gradient with respect to
    the weights (training uses REINFORCE or the soft relaxation).

    Args:
        weights: ``(..., i, j)`` non-negative weights.
        value: ``(..., j, e)``.
        generator: a ``torch.Generator`` for reproducible draws.
        num_samples: None for one draw, or the number of draws stacked in front.

    Returns:
        ``(context, indices)``: ``(..., i, e)`` and ``(..., i)``, each with a leading
        ``num_samples`` axis when it is given. A query with no visible key gets index -1 and a
        zero context.

    Example:
        >>> context, index = hard_attention(torch.tensor([[0.0, 1.0]]), torch.tensor([[5.0], [7.0]]))
        >>> context.tolist(), index.tolist()
        ([[7.0]], [1])
    """
    check_tensor("weights", weights, floating=True, min_dim=1)
    check_value(value, weights.shape[-1], "weights", weights)
    idx = hard_alignment(weights, generator=generator, num_samples=num_samples)
    j = weights.shape[-1]  # one_hot needs a class even when j = 0; slice it away again
    one_hot = nn.functional.one_hot(idx.clamp_min(0), max(j, 1))[..., :j].to(value.dtype)
    one_hot = one_hot * (idx >= 0).unsqueeze(-1).to(value.dtype)  # dead rows -> zeros
    return one_hot @ value, idx  # ([num_samples], ..., i, e), ([num_samples], ..., i)


# --------------------------------------------------------------------------- local


def _check_half_width(half_width) -> float:
    half_width = check_real("half_width D", half_width)
    if not half_width >= 0:
        raise ValueError(f"half_width D must be >= 0, got {half_width:g}")
    return half_width


def local_centre(query: Tensor, w_p: Tensor, v_p: Tensor, source_length: int) -> Tensor:
    r"""Predicted centre of the local window, :math:`p_i = S \cdot \sigma(v_p^\top \tanh(W_p q_i))`.

    Args:
        query: ``(..., i, d_q)``.
        w_p: ``(a, d_q)`` matrix :math:`W_p`.
        v_p: ``(a,)`` vector :math:`v_p`.
        source_length: :math:`S`, the number of keys; :math:`p \in (0, S)`.

    Returns:
        ``(..., i)`` real-valued centres (differentiable in every argument but ``S``).

    Example:
        >>> local_centre(torch.zeros(1, 2), torch.zeros(3, 2), torch.zeros(3), 10).tolist()
        [5.0]
    """
    check_tensor("query", query, floating=True, min_dim=1)
    check_tensor("w_p", w_p, floating=True)
    if w_p.dim() != 2:
        raise ValueError(f"w_p must be a (a, d_q) matrix, got shape {tuple(w_p.shape)}")
    _check_param("v_p", v_p, (w_p.shape[0],), "(a,)", query)
    check_like("query", query, "w_p", w_p)
    if query.shape[-1] != w_p.shape[1]:
        raise ValueError(
            f"query must have d_q = {w_p.shape[1]} features (its last dimension), "
            f"got {query.shape[-1]}"
        )
    s = check_int("source_length", source_length, minimum=1)
    return _local_centre(query, w_p, v_p, s)


def _local_centre(query: Tensor, w_p: Tensor, v_p: Tensor, s: int) -> Tensor:
    """Unchecked core of :func:`local_centre`."""
    return s * torch.sigmoid(torch.tanh(query @ w_p.transpose(0, 1)) @ v_p)  # (..., i)


def local_window(centre: Tensor, source_length: int, half_width: float) -> Tensor:
    """Boolean window ``(..., i, S)``: True at positions ``l`` (0, 1, ..., S-1) with ``|l - p| <= D``.

    Example:
        >>> local_window(torch.tensor([2.5]), 6, 1.0).int().tolist()
        [[0, 0, 1, 1, 0, 0]]
    """
    check_tensor("centre", centre, floating=True)
    s = check_int("source_length", source_length, minimum=0)
    d = _check_half_width(half_width)
    return _local_window(centre, s, d)


def _local_window(centre: Tensor, s: int, d: float) -> Tensor:
    """Unchecked core of :func:`local_window`."""
    positions = torch.arange(s, device=centre.device, dtype=centre.dtype)  # (S,)
    return (positions - centre.detach().unsqueeze(-1)).abs() <= d  # (..., i, S)


def local_alignment(
    scores: Tensor,
    centre: Tensor,
    half_width: float,
    *,
    sigma: float | None = None,
    attn_mask: Tensor | None = None,
) -> Tensor:
    r"""Local alignment (Luong et al., 2015, "local-p").

    .. math::
        a_{il} = \operatorname{softmax}_{l \in W_i}(s_{il})\,
                 \exp\!\Big(-\frac{(l - p_i)^2}{2\sigma^2}\Big),\qquad
        W_i = \{l : |l - p_i| \le D\}

    Positions outside the window get weight exactly zero; inside it the softmax is
    taken over the window only and then damped by the Gaussian, so a row sums to at
    most 1 (as in the paper; it is not renormalised). The Gaussian factor carries the
    gradient to the centre :math:`p_i`.

    Args:
        scores: ``(..., i, S)`` scores of every query against every source position.
        centre: ``(..., i)`` centres :math:`p_i` (e.g. from :func:`local_centre`).
        half_width: :math:`D \ge 0`.
        sigma: Gaussian width, default :math:`D / 2`; ``sigma = 0`` means no damping
            inside the window.
        attn_mask: boolean (**True = may attend**) or float, broadcastable to ``(..., i, S)``.

    Returns:
        ``(..., i, S)`` weights; a row whose window holds no visible key is all zeros.
    """
    check_tensor("scores", scores, floating=True, min_dim=2)
    check_tensor("centre", centre, floating=True)
    d = _check_half_width(half_width)
    if tuple(centre.shape) != tuple(scores.shape[:-1]):
        raise ValueError(
            "centre must hold one position per query, shape scores.shape[:-1] = "
            f"{tuple(scores.shape[:-1])}, got {tuple(centre.shape)}"
        )
    check_like("centre", centre, "scores", scores)
    sigma = d / 2 if sigma is None else check_real("sigma", sigma)
    if not sigma >= 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if attn_mask is not None:
        check_mask(attn_mask, scores.dtype, tuple(scores.shape), device=scores.device)
    return _local_alignment(scores, centre, d, sigma, attn_mask)


def _local_alignment(scores, centre, d, sigma, attn_mask) -> Tensor:
    """Unchecked core of :func:`local_alignment`."""
    s = scores.shape[-1]
    window = _local_window(centre, s, d)  # (..., i, S)
    # scores outside the window are never read: a NaN there does not reach the row
    scores = scores.masked_fill(~window, float("-inf"))
    weights = masked_softmax(scores, attn_mask)  # softmax over the (visible) window only
    if sigma > 0:
        positions = torch.arange(s, device=scores.device, dtype=scores.dtype)
        # z = (l - p) / sigma, only inside the window (|z| <= D / sigma there), so a tiny
        # sigma cannot turn (l - p)^2 / (2 sigma^2) into 0/0
        z = torch.where(window, (positions - centre.unsqueeze(-1)) / sigma, 0.0)  # (..., i, S)
        weights = weights * torch.exp(-0.5 * z**2)  # still exactly 0 outside the window
    return weights


class LocalAlignment(nn.Module):
    r"""Local-p attention with a learned centre predictor (Luong et al., 2015).

    Predicts a centre :math:`p_i` per query (:func:`local_centre`), turns the given
    scores into local-p weights around it (:func:`local_alignment`) and returns the
    weighted sum of the values.

    Parameters:
        w_p: ``(d_hidden, d_q)`` matrix :math:`W_p`.
        v_p: ``(d_hidden,)`` vector :math:`v_p`.

    Args:
        d_q: query size.
        d_hidden: hidden size ``a`` of the predictor.
        half_width: window half-width :math:`D \ge 0`.
        sigma: Gaussian width, default :math:`D / 2`.

    Call ``align(query (..., i, d_q), scores (..., i, S), value (..., S, e), *,
    attn_mask=None)`` -> ``(context (..., i, e), weights (..., i, S))``; the predicted
    centres are ``align.centre(query, S)``.

    Example:
        >>> align = LocalAlignment(4, 6, half_width=2.0)
        >>> context, weights = align(torch.randn(3, 4), torch.randn(3, 10), torch.randn(10, 5))
        >>> context.shape, weights.shape
        (torch.Size([3, 5]), torch.Size([3, 10]))
    """

    def __init__(self, d_q: int, d_hidden: int, half_width: float, *, sigma: float | None = None):
        super().__init__()
        self.d_q = check_int("d_q", d_q, minimum=1)
        self.d_hidden = check_int("d_hidden", d_hidden, minimum=1)
        self.half_width = _check_half_width(half_width)
        self.sigma = self.half_width / 2 if sigma is None else check_real("sigma", sigma)
        if not self.sigma >= 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.w_p = nn.Parameter(torch.empty(self.d_hidden, self.d_q))
        self.v_p = nn.Parameter(torch.empty(self.d_hidden))
        nn.init.uniform_(self.w_p, -1 / math.sqrt(self.d_q), 1 / math.sqrt(self.d_q))
        nn.init.uniform_(self.v_p, -1 / math.sqrt(self.d_hidden), 1 / math.sqrt(self.d_hidden))

    def centre(self, query: Tensor, source_length: int) -> Tensor:
        """The predicted centres ``(..., i)`` for ``source_length`` keys."""
        return local_centre(query, self.w_p, self.v_p, source_length)

    def forward(self, query: Tensor, scores: Tensor, value: Tensor, *,
                attn_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        check_tensor("scores", scores, floating=True, min_dim=2)
        _check_value(scores, value)
        centre = self.centre(query, scores.shape[-1])  # (..., i)
        weights = local_alignment(scores, centre, self.half_width, sigma=self.sigma,
                                  attn_mask=attn_mask)  # (..., i, S)
        return weights @ value, weights  # (..., i, e), (..., i, S)

    def extra_repr(self) -> str:
        return (f"d_q={self.d_q}, d_hidden={self.d_hidden}, half_width={self.half_width}, "
                f"sigma={self.sigma}")


# --------------------------------------------------------------------------- multi-dimensional


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
    r"""A score per key *per feature*: :math:`s_{ij} = W_o\,\mathrm{act}(W_1 q_i + W_2 k_j + b) + b_o \in \mathbb{R}^{f}`.

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
        >>> multidimensional_scores(torch.ones(2, 3), torch.ones(5, 3), w, w, torch.zeros(6, 4)).shape
        torch.Size([2, 5, 6])
    """
    check_tensor("w_out", w_out, floating=True)
    check_tensor("w_query", w_query, floating=True, min_dim=1)
    if w_out.dim() != 2 or w_out.shape[1] != w_query.shape[0]:
        raise ValueError(
            f"w_out must be (f, a) with a = {w_query.shape[0]}, got shape {tuple(w_out.shape)}"
        )
    check_like("w_out", w_out, "w_query", w_query)
    if out_bias is not None:
        _check_param("out_bias", out_bias, (w_out.shape[0],), "(f,)", w_out)
    hidden = additive_hidden(query, key, w_query, w_key, bias, activation)  # (..., i, j, a)
    scores = hidden @ w_out.transpose(0, 1)  # (..., i, j, f)
    return scores if out_bias is None else scores + out_bias


def multidimensional_weights(scores: Tensor, *, attn_mask: Tensor | None = None) -> Tensor:
    r"""Softmax over the keys separately for every feature: :math:`\alpha_{ijc} = \operatorname{softmax}_j(s_{ijc})`.

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
        check_mask(attn_mask, scores.dtype, tuple(scores.shape[:-1]), device=scores.device)
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
    broadcast_shapes("the batch dims of weights and value", weights.shape[:-3], value.shape[:-2])


def multidimensional_attention(weights: Tensor, value: Tensor) -> Tensor:
    r"""Element-wise weighting of the values: :math:`c_{ic} = \sum_j \alpha_{ijc} v_{jc}`.

    Args:
        weights: ``(..., i, j, e)``.
        value: ``(..., j, e)``.

    Returns:
        ``(..., i, e)`` context.

    Example:
        >>> multidimensional_attention(torch.full((1, 2, 3), 0.5), torch.ones(2, 3)).tolist()
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
        >>> context, weights = attn(torch.randn(2, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 3))
        >>> context.shape, weights.shape
        (torch.Size([2, 3]), torch.Size([2, 5, 3]))
    """

    def __init__(self, d_q: int, d_k: int, d_v: int, d_hidden: int, *,
                 activation: str | None = "tanh"):
        super().__init__()
        self.d_q = check_int("d_q", d_q, minimum=1)
        self.d_k = check_int("d_k", d_k, minimum=1)
        self.d_v = check_int("d_v", d_v, minimum=1)
        self.d_hidden = check_int("d_hidden", d_hidden, minimum=1)
        get_activation(activation)
        self.activation = activation
        self.w_query = nn.Parameter(torch.empty(self.d_hidden, self.d_q))
        self.w_key = nn.Parameter(torch.empty(self.d_hidden, self.d_k))
        self.bias = nn.Parameter(torch.empty(self.d_hidden))
        self.w_out = nn.Parameter(torch.empty(self.d_v, self.d_hidden))
        self.out_bias = nn.Parameter(torch.empty(self.d_v))
        for p, fan_in in ((self.w_query, self.d_q), (self.w_key, self.d_k),
                          (self.bias, self.d_hidden), (self.w_out, self.d_hidden),
                          (self.out_bias, self.d_hidden)):
            nn.init.uniform_(p, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))

    def forward(self, query: Tensor, key: Tensor, value: Tensor | None = None, *,
                attn_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        query, value, attn_mask, single = _attention_inputs(
            query, key, value, attn_mask, d_q=self.d_q, d_k=self.d_k, d_v=self.d_v,
            weight=self.w_query)
        act = get_activation(self.activation)
        hidden = _additive_hidden(query, key, self.w_query, self.w_key, self.bias,
                                  act)  # (b, i, j, a)
        scores = hidden @ self.w_out.transpose(0, 1) + self.out_bias  # (b, i, j, d_v)
        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(-1)  # (b, i, j, 1)
        weights = masked_softmax(scores, attn_mask, dim=-2)  # (b, i, j, d_v)
        context = (weights * value.unsqueeze(-3)).sum(dim=-2)  # (b, i, d_v)
        if single:
            return context.squeeze(-2), weights.squeeze(-3)
        return context, weights
