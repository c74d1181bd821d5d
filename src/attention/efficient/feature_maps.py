r"""Feature maps for linear attention (taught in chapter 10).

A feature map :math:`\varphi` sends a query or key ``(..., d)`` to non-negative features
``(..., f)``; linear attention (:mod:`attention.efficient.linear`) replaces the softmax
similarity :math:`\exp(q \cdot k)` by :math:`\varphi(q) \cdot \varphi(k)`. Any callable
with that shape contract works; these three are the ones chapter 10 compares.

Shape legend: ``d`` the input (query/key) size, ``f`` the feature size.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import (
    check_bool,
    check_dtype,
    check_generator,
    check_real,
    check_size,
    check_tensor,
)

# The facade re-exports the library names (the first 1); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "random_feature_map",
    "elu_feature_map",
    "relu_feature_map",
]

FeatureMap = Callable[[Tensor], Tensor]


def elu_feature_map(x: Tensor) -> Tensor:
    r""":math:`\varphi(x) = \operatorname{elu}(x) + 1`, positive everywhere (the
    default).

    Used by :cite:`katharopoulos2020transformers`: it is :math:`x + 1` for :math:`x > 0`
    and :math:`e^x` for :math:`x \le 0`, so it never reaches zero and the normaliser is
    always positive.

    Args:
        x: ``(..., d)``.

    Returns:
        ``(..., d)`` (here ``f = d``).

    Example:
        >>> phi = elu_feature_map(torch.tensor([-1.0, 0.0, 2.0]))
        >>> [round(x, 4) for x in phi.tolist()]
        [0.3679, 1.0, 3.0]
    """
    check_tensor("x", x, floating=True)
    return F.elu(x).add_(1.0)  # in place is safe: elu's backward uses its input


def relu_feature_map(x: Tensor) -> Tensor:
    r""":math:`\varphi(x) = \max(x, 0)`: non-negative, but a query or key can map to
    zero.

    Args:
        x: ``(..., d)``.

    Returns:
        ``(..., d)``, zero wherever ``x <= 0`` (here ``f = d``).

    Example:
        >>> relu_feature_map(torch.tensor([-1.0, 0.0, 2.0])).tolist()
        [0.0, 0.0, 2.0]
    """
    check_tensor("x", x, floating=True)
    return F.relu(x)


class _RandomFeatures:
    """Positive random features for the softmax kernel (FAVOR+); see
    :func:`random_feature_map`."""

    non_negative = True  # exp(...) > 0: linear attention skips its sign scan

    def __init__(self, projection: Tensor, scale: float):
        self.projection = projection  # (d, f)
        self.scale = scale

    def __call__(self, x: Tensor) -> Tensor:
        check_tensor("x", x, floating=True, min_dim=1)
        if x.shape[-1] != self.projection.shape[0]:
            raise ValueError(
                f"this random feature map was drawn for inputs of size d = "
                f"{self.projection.shape[0]}, got {x.shape[-1]}"
            )
        w = self.projection.to(dtype=x.dtype, device=x.device)
        x = x * self.scale
        f = w.shape[-1]
        # exp(w . x - |x|^2 / 2) / sqrt(f): positive, and
        # E[phi(q) . phi(k)] = exp(q . k).
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
    r"""Performer's positive random features for the softmax kernel
    :cite:`choromanski2021rethinking`.

    Draws ``w_1 ... w_f ~ N(0, I_d)`` once (orthogonal blocks if ``orthogonal``) and
    returns the feature map

    .. math::

        \varphi(x) = \frac{1}{\sqrt f}\,
        \exp\!\big(w^\top x' - \tfrac12 \lVert x' \rVert^2\big), \quad x' = s\,x,

    for which :math:`\mathbb E[\varphi(q)\cdot\varphi(k)] = \exp(s^2\, q\cdot k)`. With
    the default :math:`s = d^{-1/4}` that is the softmax attention kernel
    :math:`\exp(q \cdot k / \sqrt d)`, so linear attention with this map approximates
    softmax attention, better as ``num_features`` grows.

    Args:
        dim: the input size ``d``.
        num_features: the output size ``f``.
        generator: a CPU ``torch.Generator`` for reproducible draws.
        orthogonal: draw the ``w`` in orthogonal blocks (lower variance), each row
            rescaled to a chi-distributed norm as in the paper.
        scale: ``s`` above; default ``dim ** -0.25``.
        dtype: dtype of the stored projection (cast to the input's dtype when applied).

    Returns:
        A callable ``phi`` mapping ``(..., d)`` to ``(..., f)``; ``phi.projection`` is
        the ``(d, f)`` matrix of the ``w``.

    Example:
        >>> phi = random_feature_map(4, 8, generator=torch.Generator().manual_seed(0))
        >>> phi(torch.zeros(3, 4)).shape
        torch.Size([3, 8])
    """
    dim = check_size("dim", dim)
    num_features = check_size("num_features", num_features)
    check_generator(generator, torch.device("cpu"))  # the draws are made on the CPU
    check_bool("orthogonal", orthogonal)
    check_dtype("dtype", dtype, floating=True)
    s = dim**-0.25 if scale is None else check_real("scale", scale)
    try:  # the (d, f) projection must fit in memory: find out before drawing it
        torch.empty(dim, num_features, dtype=dtype)
    except (
        RuntimeError,
        OverflowError,
        TypeError,
    ):  # too large for memory, or for int64
        raise ValueError(
            f"a ({dim}, {num_features}) projection of {dtype} does not fit in memory; "
            "ask for fewer num_features"
        ) from None
    if orthogonal:
        blocks = []
        for _ in range(math.ceil(num_features / dim)):
            g = torch.randn(dim, dim, generator=generator, dtype=dtype)
            q, r = torch.linalg.qr(g)  # (d, d) orthonormal columns
            # Fix the signs so the directions are uniformly distributed (Haar).
            blocks.append(q * torch.sign(torch.diagonal(r)))
        w = torch.cat(blocks, dim=1)[:, :num_features]  # (d, f)
        norms = torch.randn(dim, num_features, generator=generator, dtype=dtype).norm(
            dim=0
        )
        w = w * norms  # each column gets the norm of a Gaussian vector
    else:
        w = torch.randn(dim, num_features, generator=generator, dtype=dtype)  # (d, f)
    return _RandomFeatures(w, float(s))
