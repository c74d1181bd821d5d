r"""Linear attention: feature maps, causal forms and the recurrent step (chapter 10).

The causal forms are the parallel chunkwise form and Lightning's sequential loop with
decay.

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads, ``i`` query
positions, ``j`` key positions, ``d`` query/key size, ``e`` value size, ``f`` feature
size (the output size of the feature map :math:`\varphi`), ``n`` chunks, ``c`` positions
inside a chunk.

Replacing the softmax similarity :math:`\exp(q \cdot k)` by a kernel
:math:`\varphi(q) \cdot \varphi(k)` with a non-negative feature map gives
:cite:`katharopoulos2020transformers`

.. math::

    o_i = \frac{\varphi(q_i)^\top \sum_j \varphi(k_j) v_j^\top}
               {\varphi(q_i)^\top \sum_j \varphi(k_j) + \varepsilon}
        = \frac{\varphi(q_i)^\top S}{\varphi(q_i)^\top z + \varepsilon},

with the sums over all ``j`` (or over ``j <= i`` when causal). **Where eps goes:** it is
added once to the denominator, after the dot product with the normaliser ``z``; every
function here (naive, chunked, recurrent) uses exactly this formula, so they agree to
rounding. It keeps a query whose normaliser is zero (possible with ``relu``) at a zero
output instead of NaN.

By associativity :math:`(\varphi(Q)\varphi(K)^\top) V = \varphi(Q)(\varphi(K)^\top V)`,
so the non-causal form costs :math:`O(N f e)` instead of :math:`O(N^2 d)` and never
builds the ``(i, j)`` matrix. The causal form of :func:`linear_attention` is the
*parallel chunkwise form*: quadratic inside a chunk, and the states
:math:`\varphi(K_m)^\top V_m` of all chunks summed at once by an exclusive cumulative
sum (every chunk's state is stored). Token by token it is an RNN
(:func:`linear_attention_step`).

**Decay and the denominator-free form.** ``decay=`` (a per-head log-decay
:math:`\log\lambda \le 0`, shape ``(h,)``, RetNet's and Lightning's :math:`\lambda`)
weights key ``j`` by :math:`\lambda^{i-j}` for query ``i``; ``normalize=False`` drops
the denominator (TransNormer, Lightning). :func:`lightning_attention` is Lightning
Attention-2's algorithm :cite:`qin2024lightning`: a *sequential* loop over blocks that
keeps one running state :math:`S \leftarrow \lambda^{B} S + (\Lambda K_B)^\top V_B`, a
per-head decay, no feature map and no normaliser, so its memory is one block's tile and
one state.

The sequence functions take the package's attention contract, ``(query, key, value, *,
attn_mask=None, is_causal=False, scale=None, enable_gqa=False, ...)``, and refuse what
linear attention cannot do: an ``attn_mask`` (the associativity that makes it linear
sums over all keys, or all earlier ones, without looking at pairs) and a ``scale`` (the
feature map alone sets the similarity; scale the queries first, or pass ``scale`` to
:func:`random_feature_map`). The only pattern is ``is_causal``, top-left as in
``torch.nn.functional.scaled_dot_product_attention``: query ``q`` sees keys ``k <= q``.

The feature maps live in :mod:`attention.efficient.feature_maps`;
``linear_attention_naive`` (the quadratic reference) is importable from
``attention.efficient.linear``.
"""

from __future__ import annotations

import math
from typing import cast, overload

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import (
    broadcast_shapes,
    check_bool,
    check_has_data,
    check_initial_state,
    check_real,
    check_same_device,
    check_same_dtype,
    check_size,
    check_tensor,
    validate_attention,
    validate_weights,
)
from .._core import default_scale, expand_kv_heads, matmul_skipping, tril_mask
from .feature_maps import FeatureMap, elu_feature_map, relu_feature_map

# The facade re-exports the library names (the first 4); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "linear_attention",
    "linear_attention_weights",
    "linear_attention_step",
    "lightning_attention",
    "linear_attention_naive",
]


# ------------------------------------------------------------------------- validation


def _check_options(feature_map, eps) -> tuple[FeatureMap, float]:
    if feature_map is None:
        feature_map = elu_feature_map
    if not callable(feature_map):
        raise TypeError(
            f"feature_map must be callable or None, got {type(feature_map).__name__}"
        )
    eps = check_real("eps", eps)
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return cast(FeatureMap, feature_map), eps


def _refuse_mask_and_scale(function: str, attn_mask, scale) -> None:
    """Linear attention has neither: say so instead of ignoring them."""
    if attn_mask is not None:
        raise ValueError(
            f"{function} cannot apply an attn_mask: its sums run over all keys (or, "
            "with is_causal=True, all earlier ones) without forming the (i, j) pairs a "
            "mask selects; use is_causal, or linear_attention_weights for the pairs"
        )
    if scale is not None:
        raise ValueError(
            f"{function} has no scale: the feature map alone sets the similarity; "
            "scale the queries before the call, or draw "
            f"random_feature_map(..., scale=s), got {scale}"
        )


def _check_decay_options(
    decay, normalize, is_causal, query
) -> tuple[Tensor | None, bool]:
    """``decay`` needs an order (``is_causal``); returns it as a broadcastable tensor.

    Also returns ``normalize``, checked.
    """
    normalize = check_bool("normalize", normalize)
    if decay is not None and not is_causal:
        raise ValueError(
            "decay weights key j by lambda^(i - j), which needs an order: "
            "pass is_causal=True"
        )
    return _check_decay(decay, query, head_dim=-3), normalize


def _validate(
    function: str,
    query,
    key,
    value,
    attn_mask,
    is_causal,
    scale,
    enable_gqa,
    feature_map,
    eps,
    *,
    weights_only: bool = False,
) -> tuple[FeatureMap, float]:
    """The boundary checks of the sequence functions.

    Returns the feature map and the eps to use.
    """
    if weights_only:
        validate_weights(query, key, attn_mask, is_causal, scale, enable_gqa)
    else:
        validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    _refuse_mask_and_scale(function, attn_mask, scale)
    return _check_options(feature_map, eps)


def _check_decay(decay, query: Tensor, *, head_dim: int) -> Tensor | None:
    """``decay`` as a tensor that broadcasts against the heads of ``query``.

    ``decay`` is None, a float or an ``(h,)`` tensor of log-decays <= 0; the result has
    its heads at ``head_dim`` of ``query`` (``(h, 1, ...)``).
    """
    if decay is None:
        return None
    if isinstance(decay, Tensor):
        check_tensor("decay", decay, floating=True)
        check_same_device(query=query, decay=decay)
        if decay.dim() > 1:
            raise ValueError(
                f"decay must be a float or a tensor (h,) of per-head log-decays, "
                f"got shape {tuple(decay.shape)}"
            )
        h = query.shape[head_dim] if query.dim() >= -head_dim else None
        if decay.dim() == 1 and decay.shape[0] not in (1, h):
            raise ValueError(
                f"decay must have one log-decay per head, shape ({h},), got "
                f"{tuple(decay.shape)}"
            )
        check_has_data("decay", decay)
        g = decay.to(query.dtype)
        largest = g.detach().max().item() if (g > 0).any() else 0.0
    else:  # a number is checked as a number: a meta query has no values to read
        largest = check_real("decay", decay)
        g = torch.tensor(largest, dtype=query.dtype, device=query.device)
    if largest > 0:
        raise ValueError(
            "decay is the log of lambda in (0, 1] and must be <= 0, got a maximum "
            f"of {largest:.4g}"
        )
    # lambda = 0 (log-decay -inf) would give -inf * 0 = NaN on the diagonal;
    # exp(-1000) is already 0 in every floating dtype, so the clamp changes no weight.
    g = g.clamp(min=-1000.0)
    return g.reshape(-1, *([1] * (-head_dim - 1))) if g.dim() else g


@overload
def _group_heads(
    query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool
) -> tuple[Tensor, Tensor]: ...


@overload
def _group_heads(
    query: Tensor, key: Tensor, value: None, enable_gqa: bool
) -> tuple[Tensor, None]: ...


def _group_heads(query: Tensor, key: Tensor, value: Tensor | None, enable_gqa: bool):
    """With ``enable_gqa``, repeat each key/value head for its group of query heads."""
    if not enable_gqa:
        return key, value
    h = query.shape[-3]
    return expand_kv_heads(key, h), (
        None if value is None else expand_kv_heads(value, h)
    )


def _features(
    feature_map: FeatureMap, query: Tensor, key: Tensor, *, non_negative: bool = True
) -> tuple[Tensor, Tensor]:
    """Apply the feature map to queries and keys and check the result is usable."""
    phi_q, phi_k = feature_map(query), feature_map(key)
    for name, x, phi in (("query", query, phi_q), ("key", key, phi_k)):
        if not isinstance(phi, Tensor):
            raise TypeError(
                f"feature_map must return a torch.Tensor, got {type(phi).__name__}"
            )
        if phi.shape[:-1] != x.shape[:-1]:
            raise ValueError(
                "feature_map must keep every dimension but the last, got "
                f"{tuple(x.shape)} -> {tuple(phi.shape)} for the {name}"
            )
        if phi.dtype != x.dtype:
            raise TypeError(
                "feature_map must keep the dtype of its input, got "
                f"{x.dtype} -> {phi.dtype} for the {name}"
            )
        if (
            non_negative
            and phi.device.type != "meta"
            and not _known_non_negative(feature_map)
            and (phi.detach() < 0).any()
        ):
            raise ValueError(
                "feature_map must be non-negative (the normaliser "
                "phi(q) . sum_j phi(k_j) must stay positive), got a minimum of "
                f"{phi.detach().min().item():.4g} for the {name}"
            )
    if phi_q.shape[-1] != phi_k.shape[-1]:
        raise ValueError(
            "feature_map must give queries and keys the same feature size f, "
            f"got {phi_q.shape[-1]} and {phi_k.shape[-1]}"
        )
    return phi_q, phi_k


def _known_non_negative(feature_map) -> bool:
    """Whether ``feature_map`` is non-negative by construction (no scan needed).

    True for the package's own maps; a random feature map says so with its
    ``non_negative`` attribute.
    """
    return feature_map in (elu_feature_map, relu_feature_map) or (
        getattr(feature_map, "non_negative", False) is True
    )


def _expand_batch(*tensors: Tensor) -> list[Tensor]:
    """Broadcast the leading (batch) dims of ``(..., n, x)`` tensors together."""
    batch = broadcast_shapes("the batch dims", *(t.shape[:-2] for t in tensors))
    return [t.expand(*batch, *t.shape[-2:]) for t in tensors]


# -------------------------------------------------------------------- naive reference


def linear_attention_weights(
    query: Tensor,
    key: Tensor,
    *,
    attn_mask: None = None,
    is_causal: bool = False,
    scale: None = None,
    enable_gqa: bool = False,
    feature_map: FeatureMap | None = None,
    eps: float = 1e-6,
    decay: Tensor | float | None = None,
    normalize: bool = True,
) -> Tensor:
    r"""The ``(..., h, i, j)`` weights of linear attention, built explicitly.

    For plots and tests:

    .. math::

        A_{ij} = \frac{\varphi(q_i)\cdot\varphi(k_j)}
                      {\sum_{j'} \varphi(q_i)\cdot\varphi(k_{j'}) + \varepsilon}

    with :math:`A_{ij} = 0` for :math:`j > i` when ``is_causal``. Rows sum to one up to
    the ``eps`` in the denominator.

    Args:
        query: ``(..., h, i, d)``.
        key: ``(..., h_kv, j, d)``.
        attn_mask: must be None (see the module docstring).
        is_causal: top-left causal pattern, query ``q`` sees keys ``k <= q``.
        scale: must be None.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.
        feature_map, eps, decay, normalize: as in :func:`linear_attention`.

    Returns:
        ``(..., h, i, j)`` weights (non-negative with a non-negative map).

    Example:
        >>> q = k = torch.zeros(3, 2)
        >>> w = linear_attention_weights(q, k, is_causal=True)
        >>> # equal features: the mean of the seen keys
        >>> [round(x, 4) for x in w[2].tolist()]
        [0.3333, 0.3333, 0.3333]
    """
    feature_map, eps = _validate(
        "linear_attention_weights",
        query,
        key,
        None,
        attn_mask,
        is_causal,
        scale,
        enable_gqa,
        feature_map,
        eps,
        weights_only=True,
    )
    g, normalize = _check_decay_options(decay, normalize, is_causal, query)
    key, _ = _group_heads(query, key, None, enable_gqa)
    return _naive_weights(
        *_features(feature_map, query, key, non_negative=normalize),
        is_causal,
        eps,
        g,
        normalize,
    )


def _naive_weights(
    phi_q: Tensor,
    phi_k: Tensor,
    is_causal: bool,
    eps: float,
    g: Tensor | None = None,
    normalize: bool = True,
) -> Tensor:
    scores = phi_q @ phi_k.transpose(-2, -1)  # (..., i, j)
    if is_causal:
        i, j = phi_q.shape[-2], phi_k.shape[-2]
        visible = tril_mask(i, j, device=phi_q.device)
        if g is not None:  # lambda^(i - j) on the visible pairs
            lag = (
                torch.arange(i, device=phi_q.device)[:, None]
                - torch.arange(j, device=phi_q.device)[None, :]
            ).clamp(min=0)  # (i, j)
            scores = scores * (g * lag.to(scores.dtype)).exp()
        scores = scores.masked_fill(~visible, 0.0)
    if not normalize:
        return scores
    return scores / (scores.sum(dim=-1, keepdim=True) + eps)  # (..., i, j)


def linear_attention_naive(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: None = None,
    is_causal: bool = False,
    scale: None = None,
    enable_gqa: bool = False,
    feature_map: FeatureMap | None = None,
    eps: float = 1e-6,
    decay: Tensor | float | None = None,
    normalize: bool = True,
) -> Tensor:
    r"""Linear attention the quadratic way: build the weights, then multiply the values.

    The reference :func:`linear_attention` is tested against; costs
    :math:`O(i\,j\,(f+e))` time and :math:`O(i\,j)` memory. Arguments as
    :func:`linear_attention`.

    Returns:
        ``(..., h, i, e)``.

    Example:
        >>> q, k, v = torch.zeros(3, 2), torch.zeros(3, 2), torch.arange(3.0)[:, None]
        >>> [round(x, 4) for x in linear_attention_naive(q, k, v).flatten().tolist()]
        [1.0, 1.0, 1.0]
    """
    feature_map, eps = _validate(
        "linear_attention_naive",
        query,
        key,
        value,
        attn_mask,
        is_causal,
        scale,
        enable_gqa,
        feature_map,
        eps,
    )
    g, normalize = _check_decay_options(decay, normalize, is_causal, query)
    key, value = _group_heads(query, key, value, enable_gqa)
    weights = _naive_weights(
        *_features(feature_map, query, key, non_negative=normalize),
        is_causal,
        eps,
        g,
        normalize,
    )
    future = (
        ~tril_mask(query.shape[-2], key.shape[-2], device=query.device)
        if is_causal
        else None
    )
    return matmul_skipping(weights, value, future)  # (..., i, e)


# ------------------------------------------------------------------------- fast forms


def _noncausal(phi_q: Tensor, phi_k: Tensor, value: Tensor, eps: float) -> Tensor:
    state = phi_k.transpose(-2, -1) @ value  # (..., f, e) = sum_j phi(k_j) v_j^T
    normaliser = phi_k.sum(dim=-2, keepdim=True)  # (..., 1, f) = sum_j phi(k_j)
    num = phi_q @ state  # (..., i, e)
    den = (phi_q * normaliser).sum(dim=-1, keepdim=True)  # (..., i, 1)
    return num / (den + eps)


def _causal_chunked(
    phi_q: Tensor,
    phi_k: Tensor,
    value: Tensor,
    chunk: int,
    eps: float,
    g: Tensor | None = None,
    normalize: bool = True,
) -> Tensor:
    """The parallel chunkwise form: all chunks at once (no Python loop over chunks).

    The values get an extra column of ones, so every matmul that sums
    ``phi(k_j) v_j^T`` also sums ``phi(k_j)``: the normaliser rides along in the last
    column of the numerator.
    """
    i, j = phi_q.shape[-2], phi_k.shape[-2]
    phi_q, phi_k, value = _expand_batch(phi_q, phi_k, value)
    # Top-left causal: keys past the last query are never seen, and queries past the
    # last key see all keys, so cut / pad the keys to length i (zero features add
    # nothing).
    n = max(1, math.ceil(i / chunk))
    length = n * chunk
    batch, f, e = phi_q.shape[:-2], phi_q.shape[-1], value.shape[-1]
    ones = torch.ones(*value.shape[:-1], 1, dtype=value.dtype, device=value.device)
    value = torch.cat([value, ones], dim=-1)  # (..., j, e + 1)
    if j > i:
        phi_k, value = phi_k[..., :i, :], value[..., :i, :]
    if phi_q.shape[-2] != length:
        phi_q = F.pad(phi_q, (0, 0, 0, length - phi_q.shape[-2]))
    if phi_k.shape[-2] != length:
        phi_k = F.pad(phi_k, (0, 0, 0, length - phi_k.shape[-2]))
        value = F.pad(value, (0, 0, 0, length - value.shape[-2]))
    qc = phi_q.reshape(*batch, n, chunk, f)  # (..., n, c, f)
    kc = phi_k.reshape(*batch, n, chunk, f)  # (..., n, c, f)
    vc = value.reshape(*batch, n, chunk, e + 1)  # (..., n, c, e + 1)

    # Inside a chunk: the quadratic form with the causal (lower-triangular) pattern.
    future = ~tril_mask(chunk, chunk, device=qc.device)  # (c, c)
    scores = qc @ kc.transpose(-2, -1)  # (..., n, c, c)
    if g is not None:
        return _decayed_chunks(qc, kc, vc, scores, future, g, i, length, eps, normalize)
    scores = scores.masked_fill_(future, 0.0)
    num = matmul_skipping(scores, vc, future)  # (..., n, c, e + 1)

    # Between chunks: chunk m adds phi(Q_m) S_m, where the state S_m is the sum of the
    # chunk states phi(K_l)^T [V_l, 1] of the earlier chunks l < m: a cumulative sum
    # shifted by one (shifted, not cumsum - kv: a huge chunk state would swamp the
    # earlier ones).
    kv = kc.transpose(-2, -1) @ vc  # (..., n, f, e + 1)
    state = F.pad(
        torch.cumsum(kv[..., :-1, :, :], dim=-3), (0, 0, 0, 0, 1, 0)
    )  # (..., n, f, e + 1)
    num = num.add_(qc @ state)  # (..., n, c, e + 1)

    return _finish(num, length, i, eps, normalize)


def _finish(num: Tensor, length: int, i: int, eps: float, normalize: bool) -> Tensor:
    """Cut the padding and divide by the normaliser riding in the last column."""
    num = num.reshape(*num.shape[:-3], length, num.shape[-1])[
        ..., :i, :
    ]  # (..., i, e + 1)
    if not normalize:
        return num[..., :-1]
    return num[..., :-1] / (num[..., -1:] + eps)  # (..., i, e)


def _decayed_chunks(qc, kc, vc, scores, future, g, i, length, eps, normalize) -> Tensor:
    r"""The parallel chunkwise form with a per-head log-decay ``g = log lambda``.

    ``g`` has shape ``(h, 1, 1)``. Inside a chunk key ``s`` counts :math:`\lambda^{r-s}`
    for query ``r``; the state entering chunk ``m`` is

    .. math::

        \sum_{l<m} \lambda^{c(m-1-l)} \sum_s \lambda^{c-1-s} \varphi(k_s)[v_s, 1]^\top,

    read by query ``r`` with :math:`\lambda^{r+1}`: every exponent is >= 0, every factor
    <= 1.
    """
    n, c = qc.shape[-3], qc.shape[-2]
    g4 = g.unsqueeze(-1)  # (h, 1, 1, 1) against (..., h, n, c, c)
    pos = torch.arange(c, device=qc.device, dtype=qc.dtype)
    lag = (pos[:, None] - pos[None, :]).clamp(min=0)  # (c, c)
    scores = (scores * (g4 * lag).exp()).masked_fill_(future, 0.0)  # (..., n, c, c)
    num = matmul_skipping(scores, vc, future)  # (..., n, c, e + 1)
    key_weight = (g4 * (c - 1 - pos)[:, None]).exp()  # (h, 1, c, 1)
    kv = (kc * key_weight).transpose(-2, -1) @ vc  # (..., n, f, e + 1) chunk states
    m = torch.arange(n, device=qc.device, dtype=qc.dtype)
    gap = m[:, None] - 1 - m[None, :]  # (n, n): m - 1 - l
    later = gap < 0  # chunk l is not before chunk m: its state must not reach m
    carry = (g * c * gap.clamp(min=0)).exp().masked_fill(later, 0.0)  # (h, n, n)
    f, e1 = kv.shape[-2:]
    # A masked sum, not a plain matmul: 0 x NaN would carry a NaN key or value of chunk
    # l into the earlier chunks, which the recurrence never shows it to.
    state = matmul_skipping(carry, kv.flatten(-2), later)  # (..., n, f (e + 1))
    state = state.unflatten(-1, (f, e1))  # (..., n, f, e + 1)
    query_weight = (g4 * (pos + 1)[:, None]).exp()  # (h, 1, c, 1)
    num = num.add_((qc * query_weight) @ state)  # (..., n, c, e + 1)
    return _finish(num, length, i, eps, normalize)


def linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: None = None,
    is_causal: bool = False,
    scale: None = None,
    enable_gqa: bool = False,
    feature_map: FeatureMap | None = None,
    chunk_size: int = 64,
    eps: float = 1e-6,
    decay: Tensor | float | None = None,
    normalize: bool = True,
) -> Tensor:
    r"""Linear attention in linear time.

    .. math::

        o_i = \frac{\varphi(q_i)^\top S}{\varphi(q_i)^\top z + \varepsilon}

    Non-causal: :math:`S = \varphi(K)^\top V` (``(f, e)``) and
    :math:`z = \sum_j \varphi(k_j)` are computed once, :math:`O(N f e)` time, no
    ``(i, j)`` matrix :cite:`katharopoulos2020transformers`.

    Causal (``is_causal=True``, top-left: query ``q`` sees keys ``k <= q``): the
    parallel chunkwise form. The sequence is cut into chunks of ``chunk_size``
    positions. Inside a chunk the masked quadratic form is used (``(c, c)`` tiles);
    across chunks each query adds :math:`\varphi(q_i)^\top S_{<n}` where :math:`S_{<n}`
    is the sum of the chunk states :math:`\varphi(K_m)^\top V_m` of earlier chunks, an
    exclusive cumulative sum. All chunks are processed at once with batched matmuls:
    :math:`O(N c (f + e) + N f e)` time. Any ``N`` and ``chunk_size`` work (the last
    chunk is zero-padded; a chunk longer than the sequence is cut to it). Every chunk's
    state is held at once, ``(n, f, e)`` of them: :func:`lightning_attention` is the
    sequential loop that keeps one.

    With ``decay`` (causal only), key ``j`` counts :math:`\lambda^{i-j}` for query ``i``
    in both sums; with ``normalize=False`` the output is the numerator alone,
    :math:`o_i = \sum_{j \le i} \lambda^{i-j} (\varphi(q_i) \cdot \varphi(k_j))\, v_j`.

    Args:
        query: ``(..., h, i, d)``; key ``(..., h_kv, j, d)``; value
            ``(..., h_kv, j, e)``; their leading dims broadcast.
        attn_mask: must be None: linear attention cannot apply a mask (module
            docstring).
        is_causal: top-left causal pattern.
        scale: must be None: the feature map sets the similarity.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.
        feature_map: non-negative map ``(..., d) -> (..., f)``; default
            :func:`elu_feature_map`. A negative output raises ``ValueError``.
        chunk_size: positions per chunk in the causal form (``>= 1``).
        eps: added to the denominator :math:`\varphi(q_i)^\top z` (see the module
            docstring), ``>= 0``. It keeps a query whose normaliser is zero (``j = 0``,
            ``d = 0``, or a ``relu`` map) at a zero output instead of NaN.
        decay: ``None``, a float, or a tensor ``(h,)`` of per-head log-decays
            :math:`\log\lambda \le 0` (needs ``is_causal=True``).
        normalize: divide by the normaliser (default); ``False`` gives the
            denominator-free form of TransNormer and Lightning (the feature map may then
            take any sign, e.g. the identity ``lambda x: x``).

    Returns:
        ``(..., h, i, e)``, equal to :func:`linear_attention_naive` up to rounding.

    Example:
        >>> q, k, v = torch.randn(5, 3), torch.randn(5, 3), torch.randn(5, 2)
        >>> a = linear_attention(q, k, v, is_causal=True, chunk_size=2)
        >>> b = linear_attention_naive(q, k, v, is_causal=True)
        >>> torch.allclose(a, b, atol=1e-5)
        True
    """
    feature_map, eps = _validate(
        "linear_attention",
        query,
        key,
        value,
        attn_mask,
        is_causal,
        scale,
        enable_gqa,
        feature_map,
        eps,
    )
    chunk_size = check_size("chunk_size", chunk_size)
    g, normalize = _check_decay_options(decay, normalize, is_causal, query)
    key, value = _group_heads(query, key, value, enable_gqa)
    phi_q, phi_k = _features(feature_map, query, key, non_negative=normalize)
    if not is_causal:
        if not normalize:
            return phi_q @ (phi_k.transpose(-2, -1) @ value)  # (..., i, e)
        return _noncausal(phi_q, phi_k, value, eps)
    # A chunk longer than the queries holds only padding past them: cut it.
    return _causal_chunked(
        phi_q, phi_k, value, min(chunk_size, max(1, query.shape[-2])), eps, g, normalize
    )


def linear_attention_step(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    state: tuple[Tensor, Tensor] | None = None,
    *,
    feature_map: FeatureMap | None = None,
    eps: float = 1e-6,
    decay: Tensor | float | None = None,
    normalize: bool = True,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    r"""One step of causal linear attention as an RNN: constant cost per token.

    .. math::

        S_t = \lambda S_{t-1} + \varphi(k_t) v_t^\top, \quad
        z_t = \lambda z_{t-1} + \varphi(k_t), \quad
        o_t = \frac{\varphi(q_t)^\top S_t}{\varphi(q_t)^\top z_t + \varepsilon}

    (:math:`\lambda = 1` without ``decay``; the numerator alone with
    ``normalize=False``).

    Feeding tokens ``0, 1, ...`` one at a time gives the rows of
    ``linear_attention(..., is_causal=True)``. Always returns the pair
    ``(output, state)``.

    Args:
        query: ``(..., d)`` the current query ``q_t`` (every leading dim is a batch
            dim, so ``(b, h, d)`` and ``(b, h, 1, d)`` both work).
        key: ``(..., d)``, the current key ``k_t``.
        value: ``(..., e)``, the current value ``v_t``.
        state: ``(S, z)`` from the previous step, ``S`` of shape ``(..., f, e)`` and
            ``z`` of shape ``(..., f)``; ``None`` for the first token (zero state).
        feature_map: non-negative map ``(..., d) -> (..., f)``; default
            :func:`elu_feature_map`.
        eps: added to the denominator, ``>= 0``.
        decay: ``None``, a float or a tensor ``(h,)`` of per-head log-decays ``<= 0``;
            with a tensor, the heads are the dim before ``d`` (``(..., h, d)``), or the
            one before a length-one position axis (``(..., h, 1, d)``).
        normalize: ``False`` returns :math:`\varphi(q_t)^\top S_t` (``z`` is still
            kept).

    Returns:
        ``(o_t, (S_t, z_t))`` with ``o_t`` of shape ``(..., e)``.

    Example:
        >>> q = k = torch.ones(2)
        >>> out, (S, z) = linear_attention_step(q, k, torch.ones(3))
        >>> S.shape, z.shape, out.shape
        (torch.Size([2, 3]), torch.Size([2]), torch.Size([3]))
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        check_tensor(name, t, floating=True, min_dim=1)
    check_same_dtype(query=query, key=key, value=value)
    check_same_device(query=query, key=key, value=value)
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            "query and key must share their last dimension d, "
            f"got {query.shape[-1]} and {key.shape[-1]}"
        )
    broadcast_shapes(
        "the batch dims of query, key and value",
        query.shape[:-1],
        key.shape[:-1],
        value.shape[:-1],
    )
    if state is not None:
        if not (isinstance(state, tuple | list) and len(state) == 2):
            raise TypeError(
                "state must be None or the pair (S, z) returned by the previous step"
            )
        check_tensor("S", state[0], floating=True, min_dim=2)
        check_tensor("z", state[1], floating=True, min_dim=1)
        check_same_dtype(query=query, S=state[0], z=state[1])
        check_same_device(query=query, S=state[0], z=state[1])
    feature_map, eps = _check_options(feature_map, eps)
    normalize = check_bool("normalize", normalize)
    head_dim = (
        -2
    )  # query (..., h, d); or (..., h, 1, d) with a length-one position axis
    if (
        isinstance(decay, Tensor)
        and decay.dim() == 1
        and decay.shape[0] > 1
        and query.dim() >= 3
        and query.shape[-2] == 1
        and query.shape[-3] == decay.shape[0]
    ):
        head_dim = -3
    g = _check_decay(decay, query, head_dim=head_dim)

    phi_q, phi_k = _features(
        feature_map, query.unsqueeze(-2), key.unsqueeze(-2), non_negative=normalize
    )
    phi_q, phi_k = phi_q.squeeze(-2), phi_k.squeeze(-2)  # (..., f)
    update = phi_k.unsqueeze(-1) * value.unsqueeze(-2)  # (..., f, e) = phi(k_t) v_t^T
    if state is None:
        S, z = update, phi_k
    else:
        S_prev, z_prev = state
        if (
            S_prev.shape[-2:] != update.shape[-2:]
            or z_prev.shape[-1] != phi_k.shape[-1]
        ):
            raise ValueError(
                f"state must have S of shape (..., f, e) = (..., {phi_k.shape[-1]}, "
                f"{value.shape[-1]}) and z of shape (..., {phi_k.shape[-1]}), got "
                f"{tuple(S_prev.shape)} and {tuple(z_prev.shape)}"
            )
        if g is None:
            S, z = S_prev + update, z_prev + phi_k
        else:
            lam = g.exp()  # (h, 1) or a scalar
            S, z = lam.unsqueeze(-1) * S_prev + update, lam * z_prev + phi_k
    num = (phi_q.unsqueeze(-2) @ S).squeeze(-2)  # (..., e)
    if not normalize:
        return num, (S, z)
    den = (phi_q * z).sum(dim=-1, keepdim=True)  # (..., 1)
    return num / (den + eps), (S, z)


def lightning_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: None = None,
    is_causal: bool = True,
    scale: float | None = None,
    enable_gqa: bool = False,
    decay: Tensor | float | None = None,
    block_size: int = 64,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Lightning Attention-2: causal, decayed, denominator-free, block by block.

    .. math::

        o_i = \sum_{j \le i} \lambda^{i-j}\, (s\, q_i \cdot k_j)\, v_j

    computed as Algorithm 1 of :cite:`qin2024lightning`: a sequential loop over blocks
    of ``B = block_size`` positions that keeps one running state :math:`S` ``(d, e)``.
    Block :math:`t` adds the masked quadratic form inside the block,
    :math:`[(Q_t K_t^\top) \odot D] V_t` with :math:`D_{rs} = \lambda^{r-s}`
    (``s <= r``), and the earlier blocks through the state, :math:`\Lambda Q_t S` with
    :math:`\Lambda = \mathrm{diag}(\lambda^{1}, \dots, \lambda^{B})`; then
    :math:`S \leftarrow \lambda^{B} S + (\lambda^{B-1-s} K_t)^\top V_t`. Memory: one
    ``(B, B)`` tile and one state per head, whatever the length; the parallel chunkwise
    form of :func:`linear_attention` holds every chunk's state at once instead. Rows see
    only what the recurrence sees: a NaN key or value at position ``p`` makes rows
    ``>= p`` NaN and leaves the earlier rows of its block alone.

    There is no feature map and no normaliser (TransNormer's and Lightning's choice: the
    model normalises the output afterwards). The query is multiplied by ``scale``
    (default :math:`d^{-1/2}`, as flash-linear-attention's ``lightning_attn``); apply an
    activation to ``query`` and ``key`` first if the model uses one. Equal to
    ``linear_attention(s * query, key, value, is_causal=True, decay=decay,
    normalize=False, feature_map=lambda x: x)``, and, token by token, to
    :func:`linear_attention_step` with the same options.

    Args:
        query: ``(..., h, n, d)``; key ``(..., h_kv, n, d)``; value
            ``(..., h_kv, n, e)`` (causal self-attention: queries and keys have the same
            length ``n``).
        attn_mask: must be None (module docstring).
        is_causal: must be True: the decay and the running state need an order.
        scale: multiplies the query; default :math:`d^{-1/2}`.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.
        decay: ``None`` (no decay, :math:`\lambda = 1`), a float, or a tensor ``(h,)``
            of per-head log-decays :math:`\log \lambda \le 0`.
        block_size: positions per block ``B >= 1`` (any ``n``: the last block is
            shorter).
        initial_state: ``(..., h, d, e)`` state before the first token; default zeros.
        output_final_state: also return the state after the last token.

    Returns:
        ``(..., h, n, e)``; with ``output_final_state`` the pair ``(output, state)``,
        ``state`` of shape ``(..., h, d, e)``.

    Example:
        >>> q, k, v = torch.randn(2, 7, 3), torch.randn(2, 7, 3), torch.randn(2, 7, 4)
        >>> decay = torch.tensor([-0.1, -0.5])  # one log-decay per head
        >>> a = lightning_attention(q, k, v, decay=decay, block_size=3, scale=1.0)
        >>> b = linear_attention(q, k, v, is_causal=True, decay=decay, normalize=False,
        ...                      feature_map=lambda x: x)
        >>> torch.allclose(a, b, atol=1e-5)
        True
    """
    if attn_mask is not None:
        raise ValueError(
            "lightning_attention cannot apply an attn_mask: it is causal linear "
            "attention, whose running state sums all earlier keys"
        )
    validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    if not is_causal:
        raise ValueError(
            "lightning_attention is causal only (is_causal=True): the decay "
            "lambda^(i - j) and the running state need an order"
        )
    if query.shape[-2] != key.shape[-2]:
        raise ValueError(
            "lightning_attention is causal self-attention: query and key must "
            f"have the same length n, got {query.shape[-2]} and {key.shape[-2]}"
        )
    block_size = check_size("block_size", block_size)
    output_final_state = check_bool("output_final_state", output_final_state)
    g = _check_decay(decay, query, head_dim=-3)
    key, value = _group_heads(query, key, value, enable_gqa)
    s = default_scale(scale, query.shape[-1])
    q, key, value = _expand_batch(query, key, value)  # views, no copies
    n, d, e = q.shape[-2], q.shape[-1], value.shape[-1]
    state_shape = (*q.shape[:-2], d, e)  # (..., h, d, e)
    check_initial_state(initial_state, state_shape, query)
    state = q.new_zeros(state_shape) if initial_state is None else initial_state
    g = (
        torch.zeros((), dtype=q.dtype, device=q.device) if g is None else g
    )  # (h, 1, 1) or ()
    out = q.new_empty((*q.shape[:-1], e))  # (..., n, e), filled block by block
    for start in range(0, n, block_size):
        kb, vb = (
            x[..., start : start + block_size, :] for x in (key, value)
        )  # (..., B, *)
        qb = (
            q[..., start : start + block_size, :] * s
        )  # scaled block by block: no copy of Q
        size = qb.shape[-2]
        pos = torch.arange(size, device=q.device, dtype=q.dtype)
        lag = pos[:, None] - pos[None, :]  # (B, B)
        tile = (g * lag.clamp(min=0)).exp()  # (h, B, B) or (B, B), lambda^(r - s)
        # torch.where and a masked matmul, not a product with zeros: 0 * nan is NaN, and
        # a NaN key or value at s must not reach a row r < s of the block
        future = lag < 0  # (B, B)
        scores = torch.where(
            future, 0.0, (qb @ kb.transpose(-2, -1)) * tile
        )  # (..., B, B)
        intra = matmul_skipping(scores, vb, future)  # (..., B, e)
        inter = ((g * (pos + 1)[:, None]).exp() * qb) @ state  # (..., B, e)
        out[..., start : start + size, :] = intra + inter
        key_weight = (g * (size - 1 - pos)[:, None]).exp()  # (h, B, 1) or (B, 1)
        state = (g * size).exp() * state + (key_weight * kb).transpose(
            -2, -1
        ) @ vb  # (..., d, e)
    return (out, state) if output_final_state else out
