"""Softmax, its logarithm and its Jacobian (taught in chapter 2).

Shape legend used across the package: ``b`` batch, ``h`` heads, ``i`` query positions,
``j`` key positions, ``d`` query/key size, ``e`` value size, ``n`` a sequence length
(here the length of the axis the softmax normalises over).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_bool, check_dim, check_tensor
from .._core import is_empty, max_shift, row_max, stable_softmax

# The facade re-exports the library names (the first 4); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "softmax",
    "log_softmax",
    "logsumexp",
    "entropy",
    "three_pass_softmax",
    "softmax_jacobian",
]


def _check(name: str, x, dim) -> None:
    check_tensor(name, x, floating=True)
    check_dim("dim", dim, x.dim())


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Numerically stable softmax along ``dim``.

    .. math::

        \operatorname{softmax}(x)_k = \frac{e^{x_k - m}}{\sum_l e^{x_l - m}},
        \quad m = \max_l x_l

    Subtracting the maximum changes nothing mathematically (the factor :math:`e^{-m}`
    cancels) but keeps every exponent :math:`\le 0`, so the result is finite for any
    finite input. ``-inf`` entries get weight exactly 0; a row that is entirely
    ``-inf``, or holds a NaN or ``+inf``, gives NaN, as ``torch.softmax`` does (the
    attention functions handle the all-masked row themselves). An empty axis gives an
    empty result.

    Args:
        x: scores of any shape ``(..., n, ...)``.
        dim: the axis to normalise over.

    Returns:
        A tensor of the same shape whose slices along ``dim`` are positive and sum to 1.

    Example:
        >>> softmax(torch.tensor([10.0, 50.0, 100.0])).argmax().item()
        2
    """
    _check("x", x, dim)
    if is_empty(x, dim):  # nothing to normalise (amax would refuse the empty axis)
        return x.clone()
    m = max_shift(row_max(x, dim))  # the row maximum; 0 for a row of -inf
    z = torch.exp(x - m)  # every exponent <= 0
    return z / z.sum(dim=dim, keepdim=True)


def logsumexp(x: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    r"""Stable :math:`\log \sum_k e^{x_k} = m + \log \sum_k e^{x_k - m}` along ``dim``.

    Infinite maxima are not subtracted (as in ``torch.logsumexp``), so a row holding
    ``+inf`` gives ``+inf``, an all ``-inf`` or empty row gives ``-inf``, a NaN gives
    NaN.

    Example:
        >>> round(logsumexp(torch.tensor([0.0, 0.0])).item(), 4)  # log 2
        0.6931
    """
    _check("x", x, dim)
    check_bool("keepdim", keepdim)
    if is_empty(x, dim):
        return torch.logsumexp(x, dim=dim, keepdim=keepdim)  # -inf, torch's convention
    m = max_shift(row_max(x, dim), zero_infinite=True)
    out = m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))
    return out if keepdim else out.squeeze(dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Stable log-softmax, :math:`x_k - \operatorname{logsumexp}(x)`, along ``dim``.

    Computed as :math:`(x_k - m) - \log \sum_l e^{x_l - m}`, it never takes the log of
    a number that underflowed to zero, so it stays finite where ``softmax(x).log()``
    gives ``-inf``. NaN, ``+inf`` and all ``-inf`` rows give NaN, as in torch.

    Example:
        >>> log_softmax(torch.tensor([0.0, -1e4])).tolist()
        [0.0, -10000.0]
    """
    _check("x", x, dim)
    if is_empty(x, dim):
        return x.clone()
    shifted = x - max_shift(row_max(x, dim))
    return shifted - torch.log(torch.exp(shifted).sum(dim=dim, keepdim=True))


def three_pass_softmax(x: Tensor) -> Tensor:
    """The safe softmax over the last axis, written as its three passes over the row.

    Pass 1 finds the maximum ``m``, pass 2 the normaliser ``l = sum_k exp(x_k - m)``,
    pass 3 writes each ``exp(x_k - m) / l``. Passes are counted as reads of the row, as
    Milakov and Gimelshein do: the naive softmax reads it twice (and overflows), this
    safe one three times, and the *online* softmax of chapter 14
    (:func:`~attention.online_softmax`) is back to two, because it finds ``m`` and ``l``
    together in one pass. That one-pass normaliser followed by the scaling pass is the
    "two-pass" softmax that tiled attention builds on. The loops are explicit so the
    passes are visible.

    Args:
        x: ``(..., n)`` scores.

    Returns:
        ``(..., n)`` weights, equal to :func:`softmax`.

    Example:
        >>> three_pass_softmax(torch.tensor([0.0, 0.0])).tolist()
        [0.5, 0.5]
    """
    check_tensor("x", x, floating=True, min_dim=1)
    n = x.shape[-1]
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    for k in range(n):  # pass 1: running maximum
        m = torch.maximum(m, x[..., k])
    denom = torch.zeros_like(m)
    for k in range(n):  # pass 2: normaliser
        denom = denom + torch.exp(x[..., k] - m)
    out = torch.empty_like(x)
    for k in range(n):  # pass 3: scale each entry
        out[..., k] = torch.exp(x[..., k] - m) / denom
    return out


def softmax_jacobian(z: Tensor) -> Tensor:
    r"""Jacobian of the softmax over the last axis:
    :math:`J = \operatorname{diag}(s) - s s^\top`.

    Entry :math:`J_{ik} = \partial s_i / \partial z_k` is :math:`s_i (1 - s_i)` on the
    diagonal and :math:`-s_i s_k` off it.

    Args:
        z: ``(..., n)`` logits.

    Returns:
        ``(..., n, n)`` Jacobians, one per leading index.

    Example:
        >>> J = softmax_jacobian(torch.zeros(3, dtype=torch.float64))
        >>> # rows sum to zero
        >>> torch.allclose(J.sum(-1), torch.zeros(3, dtype=torch.float64))
        True
    """
    check_tensor("z", z, floating=True, min_dim=1)
    s = stable_softmax(z, -1)
    return torch.diag_embed(s) - s.unsqueeze(-1) * s.unsqueeze(-2)  # (..., n, n)


def entropy(weights: Tensor, dim: int = -1) -> Tensor:
    r"""Shannon entropy :math:`-\sum_k p_k \log p_k` (nats) of distributions along
    ``dim``.

    Zero weights contribute 0 (the limit of :math:`p \log p`), so masked positions and
    the all-zero rows of a fully masked query are fine. A NaN weight gives NaN (as
    ``torch.special.entr``); a negative one is refused (ValueError) rather than given
    ``-inf``. An empty axis gives 0.

    Args:
        weights: ``(..., n, ...)`` probabilities.
        dim: the axis each distribution lies along.

    Returns:
        ``weights`` with ``dim`` removed.

    Example:
        >>> round(entropy(torch.tensor([0.5, 0.5, 0.0])).item(), 4)  # log 2
        0.6931
    """
    _check("weights", weights, dim)
    if weights.device.type != "meta" and bool((weights < 0).any()):
        raise ValueError(
            "weights must be probabilities (>= 0): the entropy of a negative weight is "
            f"undefined, got a minimum of {weights.min().item():.4g}"
        )
    return torch.special.entr(weights).sum(dim=dim)  # entr(p) = -p log p, entr(0) = 0
