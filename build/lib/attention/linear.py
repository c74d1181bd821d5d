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

There is no mask argument: the only pattern is ``is_causal`` (top-left, as in
``torch.nn.functional.scaled_dot_product_attention``: query ``q`` sees keys ``k <= q``).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ._checks import broadcast_shapes, check_int, check_qkv, check_tensor
from .masks import causal_mask

__all__ = [
    "elu_feature_map",
    "relu_feature_map",
    "random_feature_map",
    "performer_feature_map",
    "linear_attention",
    "linear_attention_naive",
    "linear_attention_weights",
    "linear_attention_step",
]

FeatureMap = Callable[[Tensor], Tensor]


# --------------------------------------------------------------------------- feature maps


def elu_feature_map(x: Tensor) -> Tensor:
    r""":math:`\varphi(x) = \operatorname{elu}(x) + 1`, positive everywhere (the default).

    Used by :cite:`katharopoulos2020transformers`: it is :math:`x + 1` for :math:`x > 0`
    and :math:`e^x` for :math:`x \le 0`, so it never reaches zero and the normaliser is
    always positive.

    Args:
        x: ``(..., d)``.

    Returns:
        ``(..., d)`` (here ``f = d``).

    Example:
        >>> elu_feature_map(torch.tensor([-1.0, 0.0, 2.0]))
        tensor([0.3679, 1.0000, 3.0000])
    """
    return F.elu(x).add_(1.0)  # in place is safe: elu's backward uses its input


def relu_feature_map(x: Tensor) -> Tensor:
    r""":math:`\varphi(x) = \max(x, 0)`: non-negative, but a query or key can map to zero.

    Args:
        x: ``(..., d)``.

    Returns:
        ``(..., d)`` (here ``f = d``).
    """
    return F.relu(x)


class _RandomFeatures:
    """Positive random features for the softmax kernel (FAVOR+); see :func:`random_feature_map`."""

    def __init__(self, projection: Tensor, scale: float):
        self.projection = projection  # (d, f)
        self.scale = scale

    def __call__(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.projection.shape[0]:
            raise ValueError(
                f"this random feature map was drawn for inputs of size d = "
                f"{self.projection.shape[0]}, got {x.shape[-1]}"
            )
        w = self.projection.to(dtype=x.dtype, device=x.device)
        x = x * self.scale
        f = w.shape[-1]
        # exp(w . x - |x|^2 / 2) / sqrt(f): positive, and E[phi(q) . phi(k)] = exp(q . k).
        return torch.exp(x @ w - 0.5 * (x * x).sum(-1, keepdim=True)) / math.sqrt(f)

    def __repr__(self) -> str:
        d, f = self.projection.shape
        return f"random_feature_map(d={d}, num_features={f}, scale={self.scale:.4g})"


def random_feature_map(
    dim: int,
    num_features: int,
    *,
    generator: torch.Generator | None = None,
    orthogonal: bool = True,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> FeatureMap:
    r"""Performer's positive random features for the softmax kernel :cite:`choromanski2021rethinking`.

    Draws ``w_1 ... w_f ~ N(0, I_d)`` once (orthogonal blocks if ``orthogonal``) and
    returns the feature map

    .. math:: \varphi(x) = \frac{1}{\sqrt f}\, \exp\!\big(w^\top x' - \tfrac12 \lVert x' \rVert^2\big),
              \quad x' = s\,x,

    for which :math:`\mathbb E[\varphi(q)\cdot\varphi(k)] = \exp(s^2\, q\cdot k)`. With the
    default :math:`s = d^{-1/4}` that is the softmax attention kernel
    :math:`\exp(q \cdot k / \sqrt d)`, so linear attention with this map approximates
    softmax attention, better as ``num_features`` grows.

    Args:
        dim: the input size ``d``.
        num_features: the output size ``f``.
        generator: a ``torch.Generator`` for reproducible draws.
        orthogonal: draw the ``w`` in orthogonal blocks (lower variance), each row rescaled
            to a chi-distributed norm as in the paper.
        scale: ``s`` above; default ``dim ** -0.25``.
        dtype: dtype of the stored projection (cast to the input's dtype when applied).

    Returns:
        A callable ``phi`` mapping ``(..., d)`` to ``(..., f)``; ``phi.projection`` is the
        ``(d, f)`` matrix of the ``w``.

    Example:
        >>> phi = random_feature_map(4, 8, generator=torch.Generator().manual_seed(0))
        >>> phi(torch.zeros(3, 4)).shape
        torch.Size([3, 8])
    """
    dim = check_int("dim", dim, minimum=1)
    num_features = check_int("num_features", num_features, minimum=1)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if scale is None:
        scale = dim**-0.25
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if orthogonal:
        blocks = []
        for _ in range(math.ceil(num_features / dim)):
            g = torch.randn(dim, dim, generator=generator, dtype=dtype)
            q, r = torch.linalg.qr(g)  # (d, d) orthonormal columns
            # Fix the signs so the directions are uniformly distributed (Haar).
            blocks.append(q * torch.sign(torch.diagonal(r)))
        w = torch.cat(blocks, dim=1)[:, :num_features]  # (d, f)
        norms = torch.randn(dim, num_features, generator=generator, dtype=dtype).norm(dim=0)
        w = w * norms  # each column gets the norm of a Gaussian vector
    else:
        w = torch.randn(dim, num_features, generator=generator, dtype=dtype)  # (d, f)
    return _RandomFeatures(w, float(scale))


performer_feature_map = random_feature_map


# --------------------------------------------------------------------------- validation


def _check_common(feature_map, eps) -> FeatureMap:
    if feature_map is None:
        feature_map = elu_feature_map
    if not callable(feature_map):
        raise TypeError(f"feature_map must be callable or None, got {type(feature_map).__name__}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return feature_map


def _validate(query, key, value, is_causal, feature_map, eps, chunk_size=None) -> FeatureMap:
    """The boundary checks of the public sequence functions; returns the feature map."""
    check_qkv(query, key, value)
    shapes = [query.shape[:-2], key.shape[:-2]] + ([value.shape[:-2]] if value is not None else [])
    broadcast_shapes("the batch dims of query, key and value", *shapes)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)
    return _check_common(feature_map, eps)


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
        if not _known_non_negative(feature_map) and (phi.detach() < 0).any():
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
    """The package's own maps are non-negative by construction, so the scan is skipped."""
    return feature_map in (elu_feature_map, relu_feature_map) or isinstance(
        feature_map, _RandomFeatures
    )


def _expand_batch(*tensors: Tensor) -> list[Tensor]:
    """Broadcast the leading (batch) dims of ``(..., n, x)`` tensors against each other."""
    batch = torch.broadcast_shapes(*(t.shape[:-2] for t in tensors))
    return [t.expand(*batch, *t.shape[-2:]) for t in tensors]


# --------------------------------------------------------------------------- naive reference


def linear_attention_weights(
    query: Tensor,
    key: Tensor,
    *,
    is_causal: bool = False,
    feature_map: FeatureMap | None = None,
    eps: float = 1e-6,
) -> Tensor:
    r"""The ``(..., i, j)`` weights of linear attention, built explicitly (for plots and tests).

    .. math:: A_{ij} = \frac{\varphi(q_i)\cdot\varphi(k_j)}{\sum_{j'} \varphi(q_i)\cdot\varphi(k_{j'}) + \varepsilon}

    with :math:`A_{ij} = 0` for :math:`j > i` when ``is_causal``. Rows sum to one up to
    the ``eps`` in the denominator.

    Args:
        query: ``(..., i, d)``.
        key: ``(..., j, d)``.
        is_causal: top-left causal pattern, query ``q`` sees keys ``k <= q``.
        feature_map: non-negative map ``(..., d) -> (..., f)``; default
            :func:`elu_feature_map`.
        eps: added to the denominator.

    Returns:
        ``(..., i, j)`` non-negative weights.
    """
    feature_map = _validate(query, key, None, is_causal, feature_map, eps)
    return _naive_weights(*_features(feature_map, query, key), is_causal, eps)


def _naive_weights(phi_q: Tensor, phi_k: Tensor, is_causal: bool, eps: float) -> Tensor:
    scores = phi_q @ phi_k.transpose(-2, -1)  # (..., i, j)
    if is_causal:
        visible = causal_mask(phi_q.shape[-2], phi_k.shape[-2], device=phi_q.device)
        scores = scores.masked_fill(~visible, 0.0)
    return scores / (scores.sum(dim=-1, keepdim=True) + eps)  # (..., i, j)


def linear_attention_naive(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = False,
    feature_map: FeatureMap | None = None,
    eps: float = 1e-6,
) -> Tensor:
    r"""Linear attention the quadratic way: build the weights, then multiply the values.

    The reference :func:`linear_attention` is tested against; costs :math:`O(i\,j\,(f+e))`
    time and :math:`O(i\,j)` memory.

    Args:
        query: ``(..., i, d)``.
        key: ``(..., j, d)``.
        value: ``(..., j, e)``.
        is_causal: top-left causal pattern, query ``q`` sees keys ``k <= q``.
        feature_map: non-negative map ``(..., d) -> (..., f)``; default
            :func:`elu_feature_map`.
        eps: added to the denominator (see the module docstring).

    Returns:
        ``(..., i, e)``.
    """
    feature_map = _validate(query, key, value, is_causal, feature_map, eps)
    weights = _naive_weights(*_features(feature_map, query, key), is_causal, eps)
    return weights @ value  # (..., i, e)


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
    num = scores @ vc  # (..., n, c, e + 1)

    # Between chunks: chunk m adds phi(Q_m) S_m, where the state S_m is the sum of the chunk
    # states phi(K_l)^T [V_l, 1] of the earlier chunks l < m: a cumulative sum shifted by
    # one (shifted, not cumsum - kv: a huge chunk state would swamp the earlier ones).
    kv = kc.transpose(-2, -1) @ vc  # (..., n, f, e + 1)
    state = F.pad(torch.cumsum(kv[..., :-1, :, :], dim=-3), (0, 0, 0, 0, 1, 0))  # (..., n, f, e + 1)
    num = num.add_(qc @ state)  # (..., n, c, e + 1)

    num = num.reshape(*batch, length, e + 1)[..., :i, :]  # (..., i, e + 1)
    return num[..., :e] * (num[..., e:] + eps).reciprocal()  # (..., i, e)


def linear_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    is_causal: bool = False,
    feature_map: FeatureMap | None = None,
    chunk_size: int = 64,
    eps: float = 1e-6,
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
    Any ``N`` and ``chunk_size`` work (the last chunk is zero-padded).

    Args:
        query: ``(..., i, d)``.
        key: ``(..., j, d)``.
        value: ``(..., j, e)``.
        is_causal: top-left causal pattern.
        feature_map: non-negative map ``(..., d) -> (..., f)``; default
            :func:`elu_feature_map`. A negative output raises ``ValueError``.
        chunk_size: positions per chunk in the causal form (``>= 1``).
        eps: added to the denominator :math:`\varphi(q_i)^\top z` (see the module docstring).

    Returns:
        ``(..., i, e)``, equal to :func:`linear_attention_naive` up to rounding.

    Example:
        >>> q, k, v = torch.randn(5, 3), torch.randn(5, 3), torch.randn(5, 2)
        >>> a = linear_attention(q, k, v, is_causal=True, chunk_size=2)
        >>> torch.allclose(a, linear_attention_naive(q, k, v, is_causal=True), atol=1e-5)
        True
    """
    feature_map = _validate(query, key, value, is_causal, feature_map, eps, chunk_size)
    phi_q, phi_k = _features(feature_map, query, key)
    if not is_causal:
        return _noncausal(phi_q, phi_k, value, eps)
    return _causal_chunked(phi_q, phi_k, value, chunk_size, eps)


def linear_attention_step(
    q_t: Tensor,
    k_t: Tensor,
    v_t: Tensor,
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
    ``linear_attention(..., is_causal=True)``.

    Args:
        q_t: ``(..., d)`` the current query (every leading dim is a batch dim, so
            ``(b, h, d)`` and ``(b, h, 1, d)`` both work).
        k_t: ``(..., d)``.
        v_t: ``(..., e)``.
        state: ``(S, z)`` from the previous step, ``S`` of shape ``(..., f, e)`` and ``z`` of
            shape ``(..., f)``; ``None`` for the first token (zero state).
        feature_map: non-negative map ``(..., d) -> (..., f)``; default
            :func:`elu_feature_map`.
        eps: added to the denominator.

    Returns:
        ``(o_t, (S_t, z_t))`` with ``o_t`` of shape ``(..., e)``.

    Example:
        >>> out, (S, z) = linear_attention_step(torch.ones(2), torch.ones(2), torch.ones(3))
        >>> S.shape, z.shape, out.shape
        (torch.Size([2, 3]), torch.Size([2]), torch.Size([3]))
    """
    for name, t in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        check_tensor(name, t, floating=True, min_dim=1)
        if t.dtype != q_t.dtype:
            raise TypeError(f"q_t and {name} must share a dtype, got {q_t.dtype} and {t.dtype}")
    if q_t.shape[-1] != k_t.shape[-1]:
        raise ValueError(
            "q_t and k_t must share their last dimension d, "
            f"got {q_t.shape[-1]} and {k_t.shape[-1]}"
        )
    broadcast_shapes("the batch dims of q_t, k_t and v_t", q_t.shape[:-1], k_t.shape[:-1], v_t.shape[:-1])
    feature_map = _check_common(feature_map, eps)
    phi_q, phi_k = _features(feature_map, q_t.unsqueeze(-2), k_t.unsqueeze(-2))
    phi_q, phi_k = phi_q.squeeze(-2), phi_k.squeeze(-2)  # (..., f)
    update = phi_k.unsqueeze(-1) * v_t.unsqueeze(-2)  # (..., f, e) = phi(k_t) v_t^T
    if state is None:
        S, z = update, phi_k
    else:
        if not (isinstance(state, tuple | list) and len(state) == 2):
            raise TypeError("state must be None or the pair (S, z) returned by the previous step")
        S_prev, z_prev = state
        check_tensor("S", S_prev, floating=True, min_dim=2)
        check_tensor("z", z_prev, floating=True, min_dim=1)
        if S_prev.shape[-2:] != update.shape[-2:] or z_prev.shape[-1] != phi_k.shape[-1]:
            raise ValueError(
                f"state must have S of shape (..., f, e) = (..., {phi_k.shape[-1]}, "
                f"{v_t.shape[-1]}) and z of shape (..., {phi_k.shape[-1]}), got "
                f"{tuple(S_prev.shape)} and {tuple(z_prev.shape)}"
            )
        S, z = S_prev + update, z_prev + phi_k
    num = (phi_q.unsqueeze(-2) @ S).squeeze(-2)  # (..., e)
    den = (phi_q * z).sum(dim=-1, keepdim=True)  # (..., 1)
    return num / (den + eps), (S, z)
