"""Score functions: how a query and a key become one number (taught in chapter 9).

Shape legend: ``b`` batch (any number of leading dims ``...``), ``i`` query positions,
``j`` key positions, ``d_q`` query size, ``d_k`` key size, ``a`` the hidden size of the
additive score (``d_hidden``; not ``h``, which means heads everywhere else in the
package), ``e`` value size.

Every score function maps ``query (..., i, d_q)`` and ``key (..., j, d_k)`` to
``scores (..., i, j)`` through the same call, ``score(query, key)``; the batch dims of
query and key broadcast against each other:

- dot: ``q^T k`` (:func:`dot_scores`)
- scaled dot: ``q^T k / sqrt(d)`` (:func:`scaled_dot_scores`)
- cosine: ``q^T k / (|q| |k|)`` (:func:`cosine_scores`)
- general: ``k^T W q`` (:class:`GeneralScore`)
- biased general: ``k^T (W q + b)`` (``GeneralScore(..., bias=True)``)
- activated general: ``act(k^T (W q + b))`` (``GeneralScore(..., activation=...)``)
- additive / concat: ``v^T act(W1 q + W2 k + b)`` (:class:`AdditiveScore`)

The parameter-free scores are plain functions; the learnable ones are ``nn.Module``\\ s
that own their parameters and call the functional core (:func:`general_scores`,
:func:`additive_scores`). ``additive.py`` builds complete attention layers on the
additive score (Bahdanau et al., 2015). Masks follow the package convention:
boolean, **True = may attend**, broadcastable to the ``(..., i, j)`` scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_like,
    check_real,
    check_scale,
    check_sizes,
)
from .._core import attention_scores
from ._scoring import (
    additive_hidden_core,
    check_feature_sizes,
    check_matrix,
    check_pair,
    check_param,
)

# The facade re-exports the library names (the first 2); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "GeneralScore",
    "AdditiveScore",
    "dot_scores",
    "scaled_dot_scores",
    "cosine_scores",
]

#: Activations a score may use, by name. ``None`` means the identity.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "identity": lambda x: x,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def get_activation(name: str | None) -> Callable[[Tensor], Tensor]:
    """The activation called ``name`` (``"tanh"``, ``"relu"``, ``"sigmoid"``,
    ``"identity"``/None).

    Raises:
        TypeError: for a name that is not a string or None.
        ValueError: for any other name, listing the allowed ones.

    Example:
        >>> get_activation("tanh")(torch.zeros(1)).tolist()
        [0.0]
    """
    if name is None:
        return ACTIVATIONS["identity"]
    allowed = ", ".join(repr(n) for n in sorted(ACTIVATIONS))
    if not isinstance(name, str):
        raise TypeError(
            f"activation must be one of {allowed} or None, got {type(name).__name__}"
        )
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {allowed} or None, got {name!r}")
    return ACTIVATIONS[name]


# --------------------------------------------------------------------------- checks


# --------------------------------------------------------------------------- functions


def dot_scores(query: Tensor, key: Tensor) -> Tensor:
    r"""Multiplicative (dot-product) scores :math:`s_{ij} = q_i^\top k_j`.

    Args:
        query: ``(..., i, d)``.
        key: ``(..., j, d)``.

    Returns:
        ``(..., i, j)`` scores.

    Example:
        >>> key = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
        >>> dot_scores(torch.ones(1, 2), key).tolist()
        [[3.0, 0.0]]
    """
    check_pair(query, key, same_size=True)
    return query @ key.transpose(-2, -1)  # (..., i, j)


def scaled_dot_scores(
    query: Tensor, key: Tensor, *, scale: float | None = None
) -> Tensor:
    r"""Scaled dot-product scores :math:`s_{ij} = q_i^\top k_j / \sqrt{d}` (Vaswani et
    al.).

    With unit-variance entries :math:`\operatorname{Var}(q^\top k) = d`; dividing by
    :math:`\sqrt{d}` brings the scores back to unit variance (chapter 3).

    Args:
        query: ``(..., i, d)``.
        key: ``(..., j, d)``.
        scale: multiplies the scores instead of :math:`1/\sqrt{d}`.

    Returns:
        ``(..., i, j)`` scores.

    Example:
        >>> scaled_dot_scores(torch.ones(1, 4), torch.ones(1, 4)).tolist()
        [[2.0]]
    """
    check_pair(query, key, same_size=True)
    scores, _ = attention_scores(query, key, scale=check_scale(scale))
    return scores  # (..., i, j)


def cosine_scores(query: Tensor, key: Tensor, *, eps: float = 1e-8) -> Tensor:
    r"""Cosine scores
    :math:`s_{ij} = q_i^\top k_j / \max(\lVert q_i\rVert \lVert k_j\rVert, \epsilon)`.

    Bounded in :math:`[-1, 1]`: the lengths of the vectors no longer sharpen the
    softmax, only their directions count (multiply by a temperature to sharpen again).

    Args:
        query: ``(..., i, d)``.
        key: ``(..., j, d)``.
        eps: floor on the product of norms, so a zero vector scores 0 instead of NaN.

    Returns:
        ``(..., i, j)`` scores in ``[-1, 1]``.

    Example:
        >>> query, key = torch.tensor([[3.0, 0.0]]), torch.tensor([[1.0, 1.0]])
        >>> round(cosine_scores(query, key).item(), 4)
        0.7071
    """
    check_pair(query, key, same_size=True)
    eps = check_real("eps", eps)
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    # normalise first, then take the product: q.k and |q||k| overflow for entries
    # ~1e20 in float32, the unit vectors' dot product cannot. The same value as
    # q.k / max(|q||k|, eps) = cos * min(1, |q||k| / eps); a zero vector scores 0.
    q_unit, q_norm = _unit(query)  # (..., i, d), (..., i, 1)
    k_unit, k_norm = _unit(key)  # (..., j, d), (..., j, 1)
    cos = q_unit @ k_unit.transpose(-2, -1)  # (..., i, j)
    return cos * (q_norm * (k_norm.transpose(-2, -1) / eps)).clamp(max=1.0)


def _unit(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x / |x|`` and ``|x|`` along the last axis, scaled by the largest entry first so
    the squares cannot overflow (a zero vector stays zero)."""
    tiny = torch.finfo(x.dtype).tiny
    top = (
        x.abs().amax(dim=-1, keepdim=True).clamp_min(tiny)
        if x.shape[-1]
        else x.new_ones(*x.shape[:-1], 1)
    )
    scaled = x / top
    length = scaled.norm(dim=-1, keepdim=True)
    return scaled / length.clamp_min(tiny), top * length


def general_scores(
    query: Tensor,
    key: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
) -> Tensor:
    r"""General (bilinear) scores
    :math:`s_{ij} = \mathrm{act}\big(k_j^\top W q_i + \beta_j\big)`.

    ``bias=None, activation=None`` is Luong's *general* score :math:`k^\top W q`. A
    vector bias :math:`b \in \mathbb{R}^{d_k}` gives the *biased general* score
    :math:`k^\top (W q + b)`, which adds the per-key prior :math:`\beta_j = k_j^\top b`;
    a scalar bias :math:`b` with an activation gives the *activated general* score
    :math:`\mathrm{act}(k^\top W q + b)`, as in Brauwers and Frasincar's taxonomy (a
    scalar added inside the activation shifts every score alike). Because :math:`W` is
    ``(d_k, d_q)`` the query and the key may have different sizes.

    Args:
        query: ``(..., i, d_q)``.
        key: ``(..., j, d_k)``.
        weight: ``(d_k, d_q)`` matrix :math:`W`.
        bias: ``(d_k,)`` vector :math:`b` (biased general), a 0-d scalar :math:`b`
            (activated general), or None.
        activation: ``"tanh"``, ``"relu"``, ``"sigmoid"``, ``"identity"`` or None.

    Returns:
        ``(..., i, j)`` scores.

    Example:
        >>> general_scores(torch.ones(1, 2), torch.ones(3, 2), torch.eye(2)).tolist()
        [[2.0, 2.0, 2.0]]
    """
    act = get_activation(activation)
    check_matrix("weight", weight, "d_k")
    d_k, d_q = weight.shape
    check_feature_sizes(query, key, d_q, d_k)
    check_like("query", query, "weight", weight)
    scalar = isinstance(bias, Tensor) and bias.dim() == 0
    if scalar:
        check_param("bias", bias, (), "() (a scalar)", query)
    elif bias is not None:
        check_param("bias", bias, (d_k,), "(d_k,) (or a 0-d scalar)", query)
    projected = query @ weight.transpose(0, 1)  # (..., i, d_k): W q_i
    if bias is not None and not scalar:
        projected = projected + bias  # W q_i + b
    scores = projected @ key.transpose(-2, -1)  # (..., i, j)
    return act(scores + bias if scalar and bias is not None else scores)


def _check_additive(query, key, w_query, w_key, bias) -> int:
    """Checks of the additive score's arguments; returns the hidden size ``a``."""
    check_matrix("w_query", w_query, "a")
    check_matrix("w_key", w_key, "a")
    if w_query.shape[0] != w_key.shape[0]:
        raise ValueError(
            "w_query and w_key must project to the same hidden size a, "
            f"got {w_query.shape[0]} and {w_key.shape[0]}"
        )
    check_feature_sizes(query, key, w_query.shape[1], w_key.shape[1])
    check_like("query", query, "w_query", w_query)
    check_like("query", query, "w_key", w_key)
    a = w_query.shape[0]
    if bias is not None:
        check_param("bias", bias, (a,), "(a,)", query)
    return a


def additive_hidden(
    query: Tensor,
    key: Tensor,
    w_query: Tensor,
    w_key: Tensor,
    bias: Tensor | None = None,
    activation: str | None = "tanh",
) -> Tensor:
    r"""The hidden layer of the additive score,
    :math:`\mathrm{act}(W_1 q_i + W_2 k_j + b)`.

    Each query and each key is projected once (``i + j`` projections, not ``i * j``);
    the sum is then formed by broadcasting over every pair.

    Args:
        query: ``(..., i, d_q)``.
        key: ``(..., j, d_k)``.
        w_query: ``(a, d_q)`` matrix :math:`W_1`.
        w_key: ``(a, d_k)`` matrix :math:`W_2`.
        bias: ``(a,)`` vector :math:`b`, or None.
        activation: name of the activation (default ``"tanh"`` as in Bahdanau et al.).

    Returns:
        ``(..., i, j, a)`` hidden features, one vector per (query, key) pair.

    Example:
        >>> w = torch.zeros(5, 3)
        >>> additive_hidden(torch.ones(2, 3), torch.ones(4, 3), w, w).shape
        torch.Size([2, 4, 5])
    """
    act = get_activation(activation)
    _check_additive(query, key, w_query, w_key, bias)
    return additive_hidden_core(query, key, w_query, w_key, bias, act)


def additive_scores(
    query: Tensor,
    key: Tensor,
    w_query: Tensor,
    w_key: Tensor,
    v: Tensor,
    bias: Tensor | None = None,
    activation: str | None = "tanh",
) -> Tensor:
    r"""Additive (concat, Bahdanau) scores
    :math:`s_{ij} = v^\top \mathrm{act}(W_1 q_i + W_2 k_j + b)`.

    Equal to :math:`v^\top \mathrm{act}(W [q_i; k_j] + b)` with :math:`W = [W_1\ W_2]`,
    hence "concat". The query and key sizes are free: both are projected to ``a``.

    Args:
        query: ``(..., i, d_q)``.
        key: ``(..., j, d_k)``.
        w_query: ``(a, d_q)``.
        w_key: ``(a, d_k)``.
        v: ``(a,)`` output vector :math:`v` (called :math:`w` in some texts).
        bias: ``(a,)`` or None.
        activation: name of the activation (default ``"tanh"``).

    Returns:
        ``(..., i, j)`` scores.

    Example:
        >>> additive_scores(torch.ones(2, 3), torch.ones(4, 3), torch.zeros(5, 3),
        ...                 torch.zeros(5, 3), torch.ones(5)).tolist()[0]
        [0.0, 0.0, 0.0, 0.0]
    """
    act = get_activation(activation)
    a = _check_additive(query, key, w_query, w_key, bias)
    check_param("v", v, (a,), "(a,)", query)
    hidden = additive_hidden_core(
        query, key, w_query, w_key, bias, act
    )  # (..., i, j, a)
    return hidden @ v  # (..., i, j)


# --------------------------------------------------------------------------- modules


class GeneralScore(nn.Module):
    r"""Learnable general score (Luong et al., 2015) and its biased and activated forms.

    Without an activation: :math:`k^\top (W q + b)` with a vector :math:`b` (the *biased
    general* score), or :math:`k^\top W q` without it. With an activation:
    :math:`\mathrm{act}(k^\top W q + b)` with a **scalar** :math:`b` (the *activated
    general* score of Brauwers and Frasincar's taxonomy).

    Parameters:
        weight: ``(d_k, d_q)`` matrix :math:`W`.
        bias: ``(d_k,)`` vector :math:`b` without an activation, ``()`` scalar with one
            (only with ``bias=True``).

    Args:
        d_q: query size.
        d_k: key size.
        bias: add :math:`b`.
        activation: ``"tanh"``, ``"relu"``, ``"sigmoid"``, ``"identity"`` or None (the
            *activated general* score when not None).

    Call ``score(query (..., i, d_q), key (..., j, d_k)) -> (..., i, j)``.

    Example:
        >>> score = GeneralScore(3, 5, bias=True, activation="tanh")
        >>> score(torch.randn(2, 4, 3), torch.randn(2, 6, 5)).shape
        torch.Size([2, 4, 6])
    """

    def __init__(
        self, d_q: int, d_k: int, *, bias: bool = False, activation: str | None = None
    ):
        super().__init__()
        self.d_q, self.d_k = check_sizes(d_q=d_q, d_k=d_k)
        check_bool("bias", bias)
        get_activation(activation)  # fail early on an unknown name
        self.activation = activation
        self.weight = nn.Parameter(torch.empty(self.d_k, self.d_q))
        shape = (self.d_k,) if activation is None else ()  # activated general: scalar b
        self.bias = nn.Parameter(torch.empty(shape)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform in :math:`\\pm 1/\\sqrt{d_q}`, like ``nn.Linear``."""
        bound = 1.0 / math.sqrt(self.d_q)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        return general_scores(query, key, self.weight, self.bias, self.activation)

    def extra_repr(self) -> str:
        return (
            f"d_q={self.d_q}, d_k={self.d_k}, bias={self.bias is not None}, "
            f"activation={self.activation!r}"
        )


class AdditiveScore(nn.Module):
    r"""Learnable additive score :math:`v^\top \mathrm{act}(W_1 q + W_2 k + b)`
    (Bahdanau et al., 2015).

    Parameters:
        w_query: ``(d_hidden, d_q)`` matrix :math:`W_1`.
        w_key: ``(d_hidden, d_k)`` matrix :math:`W_2`.
        bias: ``(d_hidden,)`` vector :math:`b` (only with ``bias=True``).
        v: ``(d_hidden,)`` output vector :math:`v`.

    Args:
        d_q: query size.
        d_k: key size (may differ from ``d_q``).
        d_hidden: hidden size ``a``.
        activation: name of the activation (default ``"tanh"``).
        bias: include :math:`b`.

    Call ``score(query (..., i, d_q), key (..., j, d_k)) -> (..., i, j)``.

    Example:
        >>> score = AdditiveScore(3, 5, 8)
        >>> score(torch.randn(4, 3), torch.randn(6, 5)).shape
        torch.Size([4, 6])
    """

    def __init__(
        self,
        d_q: int,
        d_k: int,
        d_hidden: int,
        activation: str | None = "tanh",
        *,
        bias: bool = True,
    ):
        super().__init__()
        self.d_q, self.d_k, self.d_hidden = check_sizes(
            d_q=d_q, d_k=d_k, d_hidden=d_hidden
        )
        check_bool("bias", bias)
        get_activation(activation)
        self.activation = activation
        self.w_query = nn.Parameter(torch.empty(self.d_hidden, self.d_q))
        self.w_key = nn.Parameter(torch.empty(self.d_hidden, self.d_k))
        self.bias = nn.Parameter(torch.empty(self.d_hidden)) if bias else None
        self.v = nn.Parameter(torch.empty(self.d_hidden))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform in :math:`\\pm 1/\\sqrt{\\text{fan-in}}` for each matrix, like
        ``nn.Linear``."""
        nn.init.uniform_(
            self.w_query, -1 / math.sqrt(self.d_q), 1 / math.sqrt(self.d_q)
        )
        nn.init.uniform_(self.w_key, -1 / math.sqrt(self.d_k), 1 / math.sqrt(self.d_k))
        bound = 1.0 / math.sqrt(self.d_hidden)
        nn.init.uniform_(self.v, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def hidden(self, query: Tensor, key: Tensor) -> Tensor:
        """``(..., i, j, d_hidden)`` hidden features
        :math:`\\mathrm{act}(W_1 q + W_2 k + b)`."""
        return additive_hidden(
            query, key, self.w_query, self.w_key, self.bias, self.activation
        )

    def forward(self, query: Tensor, key: Tensor) -> Tensor:
        return additive_scores(
            query, key, self.w_query, self.w_key, self.v, self.bias, self.activation
        )

    def extra_repr(self) -> str:
        return (
            f"d_q={self.d_q}, d_k={self.d_k}, d_hidden={self.d_hidden}, "
            f"activation={self.activation!r}, bias={self.bias is not None}"
        )
