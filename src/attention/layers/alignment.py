"""Alignment: how scores become weights, and how many weights per key (taught in
chapter 9).

Shape legend: ``b`` batch (any number of leading dims ``...``), ``i`` query positions,
``j`` key positions (``S`` of them, the source length), ``d_q`` query size, ``d_k`` key
size, ``a`` hidden size of the centre predictor (``d_hidden``), ``e`` value size; draws
of hard attention stack on a leading ``num_samples`` axis.

- **soft / global** (:func:`soft_alignment`): softmax over all keys; differentiable.
- **hard** (:func:`hard_alignment`, :func:`hard_attention`): sample one key per query
  from the soft weights (Xu et al., 2015); the output is one value vector, an unbiased
  but noisy estimate of the soft context, and not differentiable in the weights.
- **local** (:func:`local_alignment`, :class:`LocalAlignment`): predict a centre
  ``p = S * sigmoid(v_p^T tanh(W_p q))``, keep the keys of the window
  ``[p - D, p + D]`` and weigh them by ``softmax`` restricted to the window times a
  Gaussian ``exp(-(l - p)^2 / (2 sigma^2))``, ``sigma = D / 2`` (Luong et al., 2015).
- **multi-dimensional**, one weight per key *per feature*, lives with the other additive
  layer in ``additive.py`` (:class:`~attention.MultiDimensionalAttention`).

Mask convention: boolean, **True = may attend**, broadcastable to the ``(..., i, j)``
weights (as in ``torch.nn.functional.scaled_dot_product_attention``); a float mask is
added to the scores. A query with no visible key gets all-zero weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._checks import (
    broadcast_shapes,
    check_generator,
    check_has_data,
    check_int,
    check_like,
    check_mask,
    check_real,
    check_sizes,
    check_tensor,
    check_value,
)
from .._core import masked_softmax
from ._scoring import check_param

# The facade re-exports the library names (the first 2); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "hard_attention",
    "LocalAlignment",
    "hard_alignment",
    "local_alignment",
    "local_centre",
    "local_window",
    "soft_alignment",
    "soft_attention",
]


# --------------------------------------------------------------------------- soft


def soft_alignment(scores: Tensor, *, attn_mask: Tensor | None = None) -> Tensor:
    r"""Soft (global) alignment: :math:`\alpha_{ij} = \operatorname{softmax}_j(s_{ij})`
    over the visible keys.

    Args:
        scores: ``(..., i, j)`` from any score function.
        attn_mask: boolean (**True = may attend**) or float (added to the scores),
            broadcastable to ``(..., i, j)``.

    Returns:
        ``(..., i, j)`` weights: rows sum to 1, masked entries are exactly 0, a row with
        no visible key is all zeros.

    Example:
        >>> mask = torch.tensor([[True, True, False]])
        >>> soft_alignment(torch.zeros(1, 3), attn_mask=mask).tolist()
        [[0.5, 0.5, 0.0]]
    """
    check_tensor("scores", scores, floating=True, min_dim=2)
    if attn_mask is not None:
        check_mask(attn_mask, scores.dtype, tuple(scores.shape), device=scores.device)
    return masked_softmax(scores, attn_mask)


def _check_value(weights: Tensor, value) -> None:
    """value ``(..., j, e)`` matching the ``(..., i, j)`` weights (dtype, device, j,
    batch)."""
    check_value(value, weights.shape[-1], "weights", weights)
    broadcast_shapes(
        "the batch dims of weights and value", weights.shape[:-2], value.shape[:-2]
    )


def soft_attention(
    scores: Tensor, value: Tensor, *, attn_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    r"""Soft attention :math:`c_i = \sum_j \alpha_{ij} v_j` with :math:`\alpha = `
    :func:`soft_alignment`.

    Args:
        scores: ``(..., i, j)``.
        value: ``(..., j, e)``.
        attn_mask: boolean (**True = may attend**) or float, broadcastable to
            ``(..., i, j)``.

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
    r"""Hard alignment: sample one key index
    :math:`s_i \sim \operatorname{Categorical}(\alpha_{i\cdot})` per query.

    Args:
        weights: ``(..., i, j)`` non-negative weights (e.g. from
            :func:`soft_alignment`); each row is normalised before sampling. A row of
            zeros (no visible key) gets the index ``-1``.
        generator: a ``torch.Generator`` for reproducible draws.
        num_samples: None for one draw, or the number of independent draws stacked in
            front.

    Returns:
        ``(..., i)`` integer indices, or ``(num_samples, ..., i)``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> hard_alignment(torch.tensor([[0.0, 1.0, 0.0]]), generator=g).tolist()
        [1]
    """
    check_tensor("weights", weights, floating=True, min_dim=1)
    check_has_data("weights", weights)
    if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
        raise ValueError("weights must be finite and >= 0 to be sampled from")
    n = 1 if num_samples is None else check_int("num_samples", num_samples, minimum=1)
    check_generator(generator, weights.device)
    j = weights.shape[-1]
    flat = weights.detach().reshape(weights.shape[:-1].numel(), j)  # (rows, j)
    dead = flat.sum(-1) == 0  # (rows,): no visible key (every row when j = 0)
    if bool(dead.all()):  # nothing to draw from; multinomial refuses empty inputs
        idx = torch.full(
            (flat.shape[0], n), -1, dtype=torch.long, device=weights.device
        )
    else:
        safe = torch.where(dead.unsqueeze(-1), torch.ones_like(flat), flat)
        idx = torch.multinomial(
            safe, n, replacement=True, generator=generator
        )  # (rows, n)
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
    :math:`\mathbb{E}[c_i] = \sum_j \alpha_{ij} v_j`, the soft context (Xu et
    al., 2015). The estimate is unbiased; its variance
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
        ``num_samples`` axis when it is given. A query with no visible key gets index -1
        and a zero context.

    Example:
        >>> weights, value = torch.tensor([[0.0, 1.0]]), torch.tensor([[5.0], [7.0]])
        >>> context, index = hard_attention(weights, value)
        >>> context.tolist(), index.tolist()
        ([[7.0]], [1])
    """
    check_tensor("weights", weights, floating=True, min_dim=1)
    check_value(value, weights.shape[-1], "weights", weights)
    if value.dim() >= 2 and weights.dim() >= 2:  # (..., i, j) against (..., j, e)
        broadcast_shapes(
            "the batch dims of weights and value", weights.shape[:-2], value.shape[:-2]
        )
    idx = hard_alignment(weights, generator=generator, num_samples=num_samples)
    j = weights.shape[-1]  # one_hot needs a class even when j = 0; slice it away again
    one_hot = nn.functional.one_hot(idx.clamp_min(0), max(j, 1))[..., :j].to(
        value.dtype
    )
    one_hot = one_hot * (idx >= 0).unsqueeze(-1).to(value.dtype)  # dead rows -> zeros
    return one_hot @ value, idx  # ([num_samples], ..., i, e), ([num_samples], ..., i)


# --------------------------------------------------------------------------- local


def _check_half_width(half_width) -> float:
    half_width = check_real("half_width D", half_width)
    if not half_width >= 0:
        raise ValueError(f"half_width D must be >= 0, got {half_width:g}")
    return half_width


def local_centre(query: Tensor, w_p: Tensor, v_p: Tensor, source_length: int) -> Tensor:
    r"""Predicted centre of the local window,
    :math:`p_i = S \cdot \sigma(v_p^\top \tanh(W_p q_i))`.

    Args:
        query: ``(..., i, d_q)``.
        w_p: ``(a, d_q)`` matrix :math:`W_p`.
        v_p: ``(a,)`` vector :math:`v_p`.
        source_length: :math:`S`, the number of keys; :math:`p \in (0, S)`.

    Returns:
        ``(..., i)`` real-valued centres (differentiable in every argument but ``S``).

    Example:
        >>> query, w_p, v_p = torch.zeros(1, 2), torch.zeros(3, 2), torch.zeros(3)
        >>> local_centre(query, w_p, v_p, 10).tolist()
        [5.0]
    """
    check_tensor("query", query, floating=True, min_dim=1)
    check_tensor("w_p", w_p, floating=True)
    if w_p.dim() != 2:
        raise ValueError(f"w_p must be a (a, d_q) matrix, got shape {tuple(w_p.shape)}")
    check_param("v_p", v_p, (w_p.shape[0],), "(a,)", query)
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
    """Boolean window ``(..., i, S)``: True at positions ``l`` (0, 1, ..., S-1) with
    ``|l - p| <= D``.

    Example:
        >>> local_window(torch.tensor([2.5]), 6, 1.0).int().tolist()
        [[0, 0, 1, 1, 0, 0]]
    """
    check_tensor("centre", centre, floating=True)
    s = check_int("source_length", source_length, minimum=0)
    d = _check_half_width(half_width)
    if centre.device.type != "meta" and bool(centre.isnan().any()):
        raise ValueError(
            "centre holds NaN: a window needs a position (a boolean window "
            "cannot carry the NaN on)"
        )
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
        attn_mask: boolean (**True = may attend**) or float, broadcastable to
            ``(..., i, S)``.

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
    weights = masked_softmax(
        scores, attn_mask
    )  # softmax over the (visible) window only
    if sigma > 0:
        positions = torch.arange(s, device=scores.device, dtype=scores.dtype)
        # z = (l - p) / sigma, only inside the window (|z| <= D / sigma there), so a
        # tiny sigma cannot turn (l - p)^2 / (2 sigma^2) into 0/0
        z = torch.where(
            window, (positions - centre.unsqueeze(-1)) / sigma, 0.0
        )  # (..., i, S)
        weights = weights * torch.exp(-0.5 * z**2)  # still exactly 0 outside the window
    # a NaN centre has an empty window: its row is NaN, not silently zero
    return weights.masked_fill(centre.isnan().unsqueeze(-1), float("nan"))


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
        >>> query, scores = torch.randn(3, 4), torch.randn(3, 10)
        >>> context, weights = align(query, scores, torch.randn(10, 5))
        >>> context.shape, weights.shape
        (torch.Size([3, 5]), torch.Size([3, 10]))
    """

    def __init__(
        self, d_q: int, d_hidden: int, half_width: float, *, sigma: float | None = None
    ):
        super().__init__()
        self.d_q, self.d_hidden = check_sizes(d_q=d_q, d_hidden=d_hidden)
        self.half_width = _check_half_width(half_width)
        self.sigma = (
            self.half_width / 2 if sigma is None else check_real("sigma", sigma)
        )
        if not self.sigma >= 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.w_p = nn.Parameter(torch.empty(self.d_hidden, self.d_q))
        self.v_p = nn.Parameter(torch.empty(self.d_hidden))
        nn.init.uniform_(self.w_p, -1 / math.sqrt(self.d_q), 1 / math.sqrt(self.d_q))
        nn.init.uniform_(
            self.v_p, -1 / math.sqrt(self.d_hidden), 1 / math.sqrt(self.d_hidden)
        )

    def centre(self, query: Tensor, source_length: int) -> Tensor:
        """The predicted centres ``(..., i)`` for ``source_length`` keys."""
        return local_centre(query, self.w_p, self.v_p, source_length)

    def forward(
        self,
        query: Tensor,
        scores: Tensor,
        value: Tensor,
        *,
        attn_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        check_tensor("scores", scores, floating=True, min_dim=2)
        _check_value(scores, value)
        centre = self.centre(query, scores.shape[-1])  # (..., i)
        weights = local_alignment(
            scores, centre, self.half_width, sigma=self.sigma, attn_mask=attn_mask
        )  # (..., i, S)
        return weights @ value, weights  # (..., i, e), (..., i, S)

    def extra_repr(self) -> str:
        return (
            f"d_q={self.d_q}, d_hidden={self.d_hidden}, half_width={self.half_width}, "
            f"sigma={self.sigma}"
        )
