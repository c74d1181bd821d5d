"""Softmax, its logarithm and its Jacobian (taught in chapter 02).

Shape legend used across the package: ``b`` batch, ``h`` heads, ``i`` query positions,
``j`` key positions, ``d`` query/key size, ``e`` value size, ``n`` any softmax axis.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._checks import check_tensor

__all__ = ["softmax", "log_softmax", "logsumexp", "softmax_jacobian", "two_pass_softmax", "entropy"]


def _stable_max(x: Tensor, dim: int) -> Tensor:
    """Row maximum used as the shift; rows that are all ``-inf`` get a shift of 0.

    The shift is detached: softmax is invariant to it, so its gradient contribution is
    exactly zero and detaching only saves work.
    """
    m = x.detach().amax(dim=dim, keepdim=True)
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Numerically stable softmax along ``dim``.

    .. math:: \operatorname{softmax}(x)_k = \frac{e^{x_k - m}}{\sum_l e^{x_l - m}},\quad m = \max_l x_l

    Subtracting the maximum changes nothing mathematically (the factor :math:`e^{-m}`
    cancels) but keeps every exponent :math:`\le 0`, so the result is finite for any
    finite input. ``-inf`` entries get weight exactly 0; a row that is entirely
    ``-inf`` gives NaN, as ``torch.softmax`` does (the attention functions handle that
    case themselves).

    Args:
        x: scores of any shape ``(..., n, ...)``.
        dim: the axis to normalise over.

    Returns:
        A tensor of the same shape whose slices along ``dim`` are positive and sum to 1.

    Example:
        >>> softmax(torch.tensor([10.0, 50.0, 100.0])).argmax().item()
        2
    """
    check_tensor("x", x, floating=True)
    z = torch.exp(x - _stable_max(x, dim))
    return z / z.sum(dim=dim, keepdim=True)


def logsumexp(x: Tensor, dim: int = -1, keepdim: bool = False) -> Tensor:
    r"""Stable :math:`\log \sum_k e^{x_k} = m + \log \sum_k e^{x_k - m}` along ``dim``."""
    check_tensor("x", x, floating=True)
    m = _stable_max(x, dim)
    out = m + torch.log(torch.exp(x - m).sum(dim=dim, keepdim=True))
    return out if keepdim else out.squeeze(dim)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    r"""Stable log-softmax, :math:`x_k - \operatorname{logsumexp}(x)`, along ``dim``.

    Computing it this way never takes the log of a number that underflowed to zero, so
    it stays finite where ``softmax(x).log()`` gives ``-inf``.
    """
    return x - logsumexp(x, dim=dim, keepdim=True)


def two_pass_softmax(x: Tensor) -> Tensor:
    """Safe softmax over the last axis, written as explicit passes over the row.

    Phase 1 computes the normaliser: one pass for the maximum ``m``, one for
    ``sum_k exp(x_k - m)``; phase 2 writes each output. "Two-pass" names the two phases
    (normaliser, then scaling); counted as reads of the row, as Milakov and Gimelshein do,
    this classic safe softmax reads it three times. Chapter 12's online softmax computes
    the maximum and the sum in one pass. The loops are explicit so the passes are visible.

    Args:
        x: ``(..., n)`` scores.

    Returns:
        ``(..., n)`` weights, equal to :func:`softmax`.
    """
    check_tensor("x", x, floating=True)
    n = x.shape[-1]
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    for k in range(n):  # phase 1, read 1: running maximum
        m = torch.maximum(m, x[..., k])
    denom = torch.zeros_like(m)
    for k in range(n):  # phase 1, read 2: normaliser
        denom = denom + torch.exp(x[..., k] - m)
    out = torch.empty_like(x)
    for k in range(n):  # phase 2, read 3: scale each entry
        out[..., k] = torch.exp(x[..., k] - m) / denom
    return out


def softmax_jacobian(z: Tensor) -> Tensor:
    r"""Jacobian of the softmax over the last axis: :math:`J = \operatorname{diag}(s) - s s^\top`.

    Entry :math:`J_{ik} = \partial s_i / \partial z_k` is :math:`s_i (1 - s_i)` on the
    diagonal and :math:`-s_i s_k` off it.

    Args:
        z: ``(..., n)`` logits.

    Returns:
        ``(..., n, n)`` Jacobians, one per leading index.

    Example:
        >>> J = softmax_jacobian(torch.zeros(3, dtype=torch.float64))
        >>> torch.allclose(J.sum(-1), torch.zeros(3, dtype=torch.float64))  # rows sum to zero
        True
    """
    check_tensor("z", z, floating=True, min_dim=1)
    s = softmax(z, dim=-1)
    return torch.diag_embed(s) - s.unsqueeze(-1) * s.unsqueeze(-2)  # (..., n, n)


def entropy(weights: Tensor, dim: int = -1) -> Tensor:
    r"""Shannon entropy :math:`-\sum_k p_k \log p_k` (nats) of distributions along ``dim``.

    Zero weights contribute 0 (the limit of :math:`p \log p`), so masked positions are fine.
    """
    check_tensor("weights", weights, floating=True)
    plogp = torch.where(weights > 0, weights * torch.log(weights), torch.zeros_like(weights))
    return -plogp.sum(dim=dim)
