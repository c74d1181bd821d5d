r"""Linear attention: kernel feature maps, the chunked causal form and the recurrent step (chapter 10).

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

By associativity :math:`(\varphi(Q)\varphi(K)^\top) V = \varphi(Q)(\varphi(K)^\top V)`, so
the non-causal form costs :math:`O(N f e)` instead of :math:`O(N^2 d)` and never builds
the ``(i, j)`` matrix. The causal form is computed in chunks as in Lightning Attention
:cite:`qin2024lightning`: quadratic inside a chunk, a running state
:math:`S = \sum \varphi(k_j) v_j^\top` between chunks. Token by token it is an RNN
(:func:`linear_attention_step`).

The sequence functions take the package's attention contract, ``(query, key, value, *,
attn_mask=None, is_causal=False, scale=None, enable_gqa=False, ...)``, and refuse what
linear attention cannot do: an ``attn_mask`` (the associativity that makes it linear sums
over all keys, or all earlier ones, without looking at pairs) and a ``scale`` (the feature
map alone sets the similarity; scale the queries first, or pass ``scale`` to
:func:`random_feature_map`). The only pattern is ``is_causal``, top-left as in
``torch.nn.functional.scaled_dot_product_attention``: query ``q`` sees keys ``k <= q``.

The feature maps live in :mod:`attention.feature_maps`; ``linear_attention_naive`` (the
quadratic reference) is importable from ``attention.linear``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import (
    broadcast_shapes,
    check_real,
    check_same_device,
    check_same_dtype,
    check_size,
    check_tensor,
    validate_attention,
    validate_weights,
)
from ._core import _matmul_skipping, expand_kv_heads, top_left_causal
from .feature_maps import FeatureMap, elu_feature_map, relu_feature_map

__all__ = ["linear_attention", "linear_attention_weights", "linear_attention_step"]


# --------------------------------------------------------------------------- validation


def _check_options(feature_map, eps) -> tuple[FeatureMap, float]:
    if feature_map is None:
        feature_map = elu_feature_map
    if not callable(feature_map):
        raise TypeError(f"feature_map must be callable or None, got {type(feature_map).__name__}")
    eps = check_real("eps", eps)
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return feature_map, eps


def _refuse_mask_and_scale(function: str, attn_mask, scale) -> None:
    """Linear attention has neither: say so instead of ignoring them."""
    if attn_mask is not None:
        raise ValueError(
            f"{function} cannot apply an attn_mask: its sums run over all keys (or, with "
            "is_causal=True, all earlier ones) without forming the (i, j) pairs a mask "
            "selects; use is_causal, or linear_attention_weights for the pairs"
        )
    if scale is not None:
        raise ValueError(
            f"{function} has no scale: the feature map alone sets the similarity; scale the "
            f"queries before the call, or draw random_feature_map(..., scale=s), got {scale}"
        )


def _validate(function: str, query, key, value, attn_mask, is_causal, scale, enable_gqa,
              feature_map, eps, *, weights_only: bool = False) -> tuple[FeatureMap, float]:
    """The boundary checks of the sequence functions; returns the feature map and eps to use."""
    if weights_only:
        validate_weights(query, key, attn_mask, is_causal, scale, enable_gqa)
    else:
        validate_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    _refuse_mask_and_scale(function, attn_mask, scale)
    return _check_options(feature_map, eps)


def _group_heads(query: Tensor, key: Tensor, value: Tensor | None, enable_gqa: bool):
    """With ``enable_gqa``, repeat each key/value head for its group of query heads."""
    if not enable_gqa:
        return key, value
    h = query.shape[-3]
    return expand_kv_heads(key, h), (None if value is None else expand_kv_heads(value, h))


def _features(feature_map: FeatureMap, query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
    """Apply the feature map to queries and keys and check the result is usable."""
    phi_q, phi_k = feature_map(query), feature_map(key)
    for name, x, phi in (("query", query, phi_q), ("key", key, phi_k)):
        if not isinstance(phi, Tensor):
            raise TypeError(f"feature_map must return a torch.Tensor, got {type(phi).__name__}")
        if phi.shape[:-1] != x.shape[:-1]:
            raise ValueError(
                f"feature_map must keep every dimension but the last, got {tuple(x.shape)} "
                f"-> {tuple(phi.shape)} for the {name}"
            )
        if phi.dtype != x.dtype:
            raise TypeError(
                f"feature_map must keep the dtype of its input, got {x.dtype} -> {phi.dtype} for the {name}"
            )
        if phi.device.type != "meta" and not _known_non_negative(feature_map) and (phi.detach() < 0).any():
            raise ValueError(
                "feature_map must be non-negative (the normaliser phi(q) . sum_j phi(k_j) must "
                f"stay positive), got a minimum of {phi.detach().min().item():.4g} for the {name}"
            )
    if phi_q.shape[-1] != phi_k.shape[-1]:
        raise ValueError(
            "feature_map must give queries and keys the same feature size f, "
            f"got {phi_q.shape[-1]} and {phi_k.shape[-1]}"
        )
    return phi_q, phi_k


def _known_non_negative(feature_map) -> bool:
    """The package's own maps are non-negative by construction, so the scan is skipped
    (a random feature map says so with its ``non_negative`` attribute)."""
    return feature_map in (elu_feature_map, relu_feature_map) or (
        getattr(feature_map, "non_negative", False) is True
    )


def _expand_batch(*tensors: Tensor) -> list[Tensor]:
    """Broadcast the leading (batch) dims of ``(..., n, x)`` tensors against each other."""
    batch = broadcast_shapes("the batch dims", *(t.shape[:-2] for t in tensors))
    return [t.expand(*batch, *t.shape[-2:]) for t in tensors]


# --------------------------------------------------------------------------- naive reference


def linear_attention_weights(
    query: Tensor, key: Tensor, *,
    attn_mask: None = None, is_causal: bool = False, scale: None = None, enable_gqa: bool = False,
    feature_map: FeatureMap | None = None, eps: float = 1e-6,
) -> Tensor:
    r"""The ``(..., h, i, j)`` weights of linear attention, built explicitly (for plots and tests).

    .. math:: A_{ij} = \frac{\varphi(q_i)\cdot\varphi(k_j)}{\sum_{j'} \varphi(q_i)\cdot\varphi(k_{j'}) + \varepsilon}

    with :math:`A_{ij} = 0` for :math:`j > i` when ``is_causal``. Rows sum to one up to
    the ``eps`` in the denominator.

    Args:
        query: ``(..., h, i, d)``.
        key: ``(..., h_kv, j, d)``.
        attn_mask: must be None (see the module docstring).
        is_causal: top-left causal pattern, query ``q`` sees keys ``k <= q``.
        scale: must be None.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.
        feature_map, eps: as in :func:`linear_attention`.

    Returns:
        ``(..., h, i, j)`` non-negative weights.

    Example:
        >>> w = linear_attention_weights(torch.zeros(3, 2), torch.zeros(3, 2), is_causal=True)
        >>> [round(x, 4) for x in w[2].tolist()]  # equal features: the mean of the seen keys
        [0.3333, 0.3333, 0.3333]
    """
    feature_map, eps = _validate("linear_attention_weights", query, key, None, attn_mask, is_causal,
                            scale, enable_gqa, feature_map, eps, weights_only=True)
    key, _ = _group_heads(query, key, None, enable_gqa)
    return _naive_weights(*_features(feature_map, query, key), is_causal, eps)


def _naive_weights(phi_q: Tensor, phi_k: Tensor, is_causal: bool, eps: float) -> Tensor:
    scores = phi_q @ phi_k.transpose(-2, -1)  # (..., i, j)
    if is_causal:
        visible = top_left_causal(phi_q.shape[-2], phi_k.shape[-2], device=phi_q.device)
        scores = scores.masked_fill(~visible, 0.0)
    return scores / (scores.sum(dim=-1, keepdim=True) + eps)  # (..., i, j)


def linear_attention_naive(
    query: Tensor, key: Tensor, value: Tensor, *,
    attn_mask: None = None, is_causal: bool = False, scale: None = None, enable_gqa: bool = False,
    feature_map: FeatureMap | None = None, eps: float = 1e-6,
) -> Tensor:
    r"""Linear attention the quadratic way: build the weights, then multiply the values.

    The reference :func:`linear_attention` is tested against; costs :math:`O(i\,j\,(f+e))`
    time and :math:`O(i\,j)` memory. Arguments as :func:`linear_attention`.

    Returns:
        ``(..., h, i, e)``.

    Example:
        >>> q, k, v = torch.zeros(3, 2), torch.zeros(3, 2), torch.arange(3.0)[:, None]
        >>> [round(x, 4) for x in linear_attention_naive(q, k, v).flatten().tolist()]
        [1.0, 1.0, 1.0]
    """
    feature_map, eps = _validate("linear_attention_naive", query, key, value, attn_mask, is_causal,
                            scale, enable_gqa, feature_map, eps)
    key, value = _group_heads(query, key, value, enable_gqa)
    weights = _naive_weights(*_features(feature_map, query, key), is_causal, eps)
    future = ~top_left_causal(query.shape[-2], key.shape[-2], query.device) if is_causal else None
    return _matmul_skipping(weights, value, future)  # (..., i, e)


# --------------------------------------------------------------------------- fast forms


def _noncausal(phi_q: Tensor, phi_k: Tensor, value: Tensor, eps: float) -> Tensor:
    state = phi_k.transpose(-2, -1) @ value  # (..., f, e) = sum_j phi(k_j) v_j^T
    normaliser = phi_k.sum(dim=-2, keepdim=True)  # (..., 1, f) = sum_j phi(k_j)
    num = phi_q @ state  # (..., i, e)
    den = (phi_q * normaliser).sum(dim=-1, keepdim=True)  # (..., i, 1)
    return num / (den + eps)


def _causal_chunked(phi_q: Tensor, phi_k: Tensor, value: Tensor, chunk: int, eps: float) -> Tensor:
    """Chunked causal linear attention, all chunks at once (no Python loop over chunks).

    The values get an extra column of ones, so every matmul that sums
    ``phi(k_j) v_j^T`` also sums ``phi(k_j)``: the normaliser rides along in the last
    column of the numerator.
    """
    i, j = phi_q.shape[-2], phi_k.shape[-2]
    phi_q, phi_k, value = _expand_batch(phi_q, phi_k, value)
    # Top-left causal: keys past the last query are never seen, and queries past the last
    # key see all keys, so cut / pad the keys to length i (zero features add nothing).
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
    future = torch.ones(chunk, chunk, dtype=torch.bool, device=qc.device).triu_(1)  # (c, c)
    scores = (qc @ kc.transpose(-2, -1)).masked_fill_(future, 0.0)  # (..., n, c, c)
    num = _matmul_skipping(scores, vc, future)  # (..., n, c, e + 1)

    # Between chunks: chunk m adds phi(Q_m) S_m, where the state S_m is the sum of the chunk
    # states phi(K_l)^T [V_l, 1] of the earlier chunks l < m: a cumulative sum shifted by
    # one (shifted, not cumsum - kv: a huge chunk state would swamp the earlier ones).
    kv = kc.transpose(-2, -1) @ vc  # (..., n, f, e + 1)
    state = F.pad(torch.cumsum(kv[..., :-1, :, :], dim=-3), (0, 0, 0, 0, 1, 0))  # (..., n, f, e + 1)
    num = num.add_(qc @ state)  # (..., n, c, e + 1)

    num = num.reshape(*batch, length, e + 1)[..., :i, :]  # (..., i, e + 1)
    return num[..., :e] / (num[..., e:] + eps)  # (..., i, e)


def linear_attention(
    query: Tensor, key: Tensor, value: Tensor, *,
    attn_mask: None = None, is_causal: bool = False, scale: None = None, enable_gqa: bool = False,
    feature_map: FeatureMap | None = None, chunk_size: int = 64, eps: float = 1e-6,
) -> Tensor:
    r"""Linear attention in linear time: :math:`o_i = \varphi(q_i)^\top S / (\varphi(q_i)^\top z + \varepsilon)`.

    Non-causal: :math:`S = \varphi(K)^\top V` (``(f, e)``) and :math:`z = \sum_j \varphi(k_j)`
    are computed once, :math:`O(N f e)` time, no ``(i, j)`` matrix
    :cite:`katharopoulos2020transformers`.

    Causal (``is_causal=True``, top-left: query ``q`` sees keys ``k <= q``): the sequence
    is cut into chunks of ``chunk_size`` positions :cite:`qin2024lightning`. Inside a chunk
    the masked quadratic form is used (``(c, c)`` tiles); across chunks each query adds
    :math:`\varphi(q_i)^\top S_{<n}` where :math:`S_{<n}` is the sum of the chunk states
    :math:`\varphi(K_m)^\top V_m` of earlier chunks, an exclusive cumulative sum. All chunks
    are processed at once with batched matmuls: :math:`O(N c (f + e) + N f e)` time.
    Any ``N`` and ``chunk_size`` work (the last chunk is zero-padded; a chunk longer than
    the sequence is cut to it).

    Args:
        query: ``(..., h, i, d)``; key ``(..., h_kv, j, d)``; value ``(..., h_kv, j, e)``;
            their leading dims broadcast.
        attn_mask: must be None: linear attention cannot apply a mask (module docstring).
        is_causal: top-left causal pattern.
        scale: must be None: the feature map sets the similarity.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``.
        feature_map: non-negative map ``(..., d) -> (..., f)``; default
            :func:`elu_feature_map`. A negative output raises ``ValueError``.
        chunk_size: positions per chunk in the causal form (``>= 1``).
        eps: added to the denominator :math:`\varphi(q_i)^\top z` (see the module
            docstring), ``>= 0``. It keeps a query whose normaliser is zero (``j = 0``,
            ``d = 0``, or a ``relu`` map) at a zero output instead of NaN.

    Returns:
        ``(..., h, i, e)``, equal to :func:`linear_attention_naive` up to rounding.

    Example:
        >>> q, k, v = torch.randn(5, 3), torch.randn(5, 3), torch.randn(5, 2)
        >>> a = linear_attention(q, k, v, is_causal=True, chunk_size=2)
        >>> torch.allclose(a, linear_attention_naive(q, k, v, is_causal=True), atol=1e-5)
        True
    """
    feature_map, eps = _validate("linear_attention", query, key, value, attn_mask, is_causal, scale,
                            enable_gqa, feature_map, eps)
    chunk_size = check_size("chunk_size", chunk_size)
    key, value = _group_heads(query, key, value, enable_gqa)
    phi_q, phi_k = _features(feature_map, query, key)
    if not is_causal:
        return _noncausal(phi_q, phi_k, value, eps)
    # A chunk longer than the queries holds only padding past them: cut it.
    return _causal_chunked(phi_q, phi_k, value, min(chunk_size, max(1, query.shape[-2])), eps)


def linear_attention_step(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    state: tuple[Tensor, Tensor] | None = None,
    *,
    feature_map: FeatureMap | None = None,
    eps: float = 1e-6,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    r"""One step of causal linear attention as an RNN: constant cost per token.

    .. math::

        S_t = S_{t-1} + \varphi(k_t) v_t^\top, \quad z_t = z_{t-1} + \varphi(k_t), \quad
        o_t = \frac{\varphi(q_t)^\top S_t}{\varphi(q_t)^\top z_t + \varepsilon}.

    Feeding tokens ``0, 1, ...`` one at a time gives the rows of
    ``linear_attention(..., is_causal=True)``. Always returns the pair ``(output, state)``.

    Args:
        query: ``(..., d)`` the current query ``q_t`` (every leading dim is a batch dim, so
            ``(b, h, d)`` and ``(b, h, 1, d)`` both work).
        key: ``(..., d)``, the current key ``k_t``.
        value: ``(..., e)``, the current value ``v_t``.
        state: ``(S, z)`` from the previous step, ``S`` of shape ``(..., f, e)`` and ``z`` of
            shape ``(..., f)``; ``None`` for the first token (zero state).
        feature_map: non-negative map ``(..., d) -> (..., f)``; default
            :func:`elu_feature_map`.
        eps: added to the denominator, ``>= 0``.

    Returns:
        ``(o_t, (S_t, z_t))`` with ``o_t`` of shape ``(..., e)``.

    Example:
        >>> out, (S, z) = linear_attention_step(torch.ones(2), torch.ones(2), torch.ones(3))
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
    broadcast_shapes("the batch dims of query, key and value",
                     query.shape[:-1], key.shape[:-1], value.shape[:-1])
    if state is not None:
        if not (isinstance(state, tuple | list) and len(state) == 2):
            raise TypeError("state must be None or the pair (S, z) returned by the previous step")
        check_tensor("S", state[0], floating=True, min_dim=2)
        check_tensor("z", state[1], floating=True, min_dim=1)
        check_same_dtype(query=query, S=state[0], z=state[1])
        check_same_device(query=query, S=state[0], z=state[1])
    feature_map, eps = _check_options(feature_map, eps)

    phi_q, phi_k = _features(feature_map, query.unsqueeze(-2), key.unsqueeze(-2))
    phi_q, phi_k = phi_q.squeeze(-2), phi_k.squeeze(-2)  # (..., f)
    update = phi_k.unsqueeze(-1) * value.unsqueeze(-2)  # (..., f, e) = phi(k_t) v_t^T
    if state is None:
        S, z = update, phi_k
    else:
        S_prev, z_prev = state
        if S_prev.shape[-2:] != update.shape[-2:] or z_prev.shape[-1] != phi_k.shape[-1]:
            raise ValueError(
                f"state must have S of shape (..., f, e) = (..., {phi_k.shape[-1]}, "
                f"{value.shape[-1]}) and z of shape (..., {phi_k.shape[-1]}), got "
                f"{tuple(S_prev.shape)} and {tuple(z_prev.shape)}"
            )
        S, z = S_prev + update, z_prev + phi_k
    num = (phi_q.unsqueeze(-2) @ S).squeeze(-2)  # (..., e)
    den = (phi_q * z).sum(dim=-1, keepdim=True)  # (..., 1)
    return num / (den + eps), (S, z)
