"""Model-agnostic statistics of attention maps, per layer and head (chapter 17).

Each function takes weights ``(..., h, i, j)`` (or ``(..., i, j)``), e.g. the maps of
one sentence stacked over a model's layers, ``(num_layers, h, i, j)``, and reduces the
query and key axes to one number per head (or per layer): how spread out the rows are,
how much weight goes to chosen keys, how different the heads are.

Shape legend: ``h`` heads, ``i`` query positions, ``j`` key positions; every leading
dim ``...`` is kept. NaN in a map propagates to its statistics. ``head_distances`` and
``top_heads`` are importable from ``attention.practice.head_stats``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from .._checks import check_int, check_size, check_tensor
from ..foundations.softmax import entropy

# The facade re-exports the library names (the first 4); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "mean_attention_entropy",
    "attention_share",
    "sink_share",
    "head_diversity",
    "top_heads",
    "head_distances",
]


def _positions(name: str, positions, size: int) -> list[int]:
    """One position or several (ints, or a 1-D integer tensor), each in [0, size)."""
    if isinstance(positions, Tensor):
        if (
            positions.is_floating_point()
            or positions.dtype == torch.bool
            or positions.dim() > 1
        ):
            raise TypeError(
                f"{name} must be integer positions, got a tensor of dtype "
                f"{positions.dtype} and shape {tuple(positions.shape)}"
            )
        positions = positions.reshape(-1).tolist()
    elif isinstance(positions, str) or not isinstance(positions, Sequence | range):
        positions = [positions]
    checked = [check_int(name, p) for p in positions]
    if not checked or any(not 0 <= p < size for p in checked):
        raise ValueError(
            f"{name} must be a non-empty list of positions in [0, {size}), "
            f"got {checked}"
        )
    return checked


def mean_attention_entropy(attentions: Tensor) -> Tensor:
    r"""Entropy of each query's attention row (nats), averaged over the queries.

    :math:`\bar H = \frac1n \sum_i -\sum_j A_{ij} \log A_{ij}`: 0 when every query
    looks at one key, :math:`\log n` when every query spreads its weight evenly over
    ``n`` keys.

    Args:
        attentions: ``(..., i, j)``, e.g. ``(num_layers, h, i, j)``.

    Returns:
        ``(...)``, e.g. ``(num_layers, h)``; NaN where there is no query row
        (``i = 0``).

    Example:
        >>> round(mean_attention_entropy(torch.full((3, 4), 0.25)).item(), 4)  # log 4
        1.3863
    """
    check_tensor("attentions", attentions, floating=True, min_dim=2)
    return entropy(attentions, dim=-1).mean(dim=-1)  # (...)


def sink_share(attentions: Tensor, keys: int | Sequence[int]) -> Tensor:
    r"""Weight the queries put on the key position(s) ``keys``, averaged over queries.

    :math:`\frac1n \sum_i \sum_{j \in \text{keys}} A_{ij}`; with ``keys`` the ``[CLS]``
    and ``[SEP]`` positions this measures how much a head "parks" its weight on them.

    Args:
        attentions: ``(..., i, j)``, e.g. ``(num_layers, h, i, j)``.
        keys: one key position or several.

    Returns:
        ``(...)`` in [0, 1], e.g. ``(num_layers, h)``.

    Example:
        >>> sink_share(torch.tensor([[0.5, 0.5], [1.0, 0.0]]), 0).item()
        0.75
    """
    check_tensor("attentions", attentions, floating=True, min_dim=2)
    keys = _positions("keys", keys, attentions.shape[-1])
    return attentions[..., keys].sum(dim=-1).mean(dim=-1)  # (...)


def _kl_bits(p: Tensor, q: Tensor) -> Tensor:
    """KL(p || q) in bits along the last dim, with 0 log 0 = 0 (q > 0 wherever p > 0).

    Only exact zeros of ``p`` are skipped, so a NaN in ``p`` reaches the result.
    """
    ratio = torch.where(
        p == 0, torch.ones_like(p), p / q.clamp_min(torch.finfo(q.dtype).tiny)
    )
    return (p * torch.log2(ratio)).sum(dim=-1)


def head_distances(attentions: Tensor) -> Tensor:
    r"""Jensen-Shannon distance between each pair of heads' maps, averaged over queries.

    For heads ``a`` and ``b`` and query row ``i``, with :math:`M = (P + Q)/2`,
    :math:`\mathrm{JS} = \tfrac12 \mathrm{KL}(P\|M) + \tfrac12 \mathrm{KL}(Q\|M)` in
    bits, and the distance is :math:`\sqrt{\mathrm{JS}} \in [0, 1]` (0: same row, 1:
    disjoint supports). The result is its mean over the query rows.

    Args:
        attentions: ``(..., h, i, j)``, e.g. ``(num_layers, h, i, j)``.

    Returns:
        ``(..., h, h)``, symmetric with a zero diagonal.

    Example:
        >>> # two heads, disjoint keys
        >>> maps = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
        >>> head_distances(maps).tolist()
        [[0.0, 1.0], [1.0, 0.0]]
    """
    check_tensor("attentions", attentions, floating=True, min_dim=3)
    p = attentions.unsqueeze(-3)  # (..., h, 1, i, j)
    q = attentions.unsqueeze(-4)  # (..., 1, h, i, j)
    m = 0.5 * (p + q)  # (..., h, h, i, j)
    js = 0.5 * _kl_bits(p, m) + 0.5 * _kl_bits(q, m)  # (..., h, h, i)
    return js.clamp(0.0, 1.0).sqrt().mean(dim=-1)  # (..., h, h)


def head_diversity(attentions: Tensor) -> Tensor:
    """Mean Jensen-Shannon distance over all pairs of distinct heads within a layer.

    0 when all heads draw the same map; near 1 when every pair of heads looks at
    disjoint keys. See :func:`head_distances`.

    Args:
        attentions: ``(..., h, i, j)``, e.g. ``(num_layers, h, i, j)``; needs
            ``h >= 2``.

    Returns:
        ``(...)``, e.g. ``(num_layers,)``.

    Example:
        >>> head_diversity(torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])).item()
        1.0
    """
    check_tensor("attentions", attentions, floating=True, min_dim=3)
    h = attentions.shape[-3]
    if h < 2:
        raise ValueError(f"head diversity needs at least 2 heads, got {h}")
    pairs = list(itertools.combinations(range(h), 2))
    a, b = (torch.tensor(side) for side in zip(*pairs, strict=True))
    return head_distances(attentions)[..., a, b].mean(dim=-1)  # (...)


def attention_share(
    attentions: Tensor, query: int, keys: int | Sequence[int]
) -> Tensor:
    r"""The share of query ``query``'s attention that goes to the keys at ``keys``.

    :math:`s = \sum_{j \in \text{keys}} A_{\text{query}, j}`, for every leading index.

    Args:
        attentions: ``(..., i, j)`` weights, e.g. ``(num_layers, h, i, j)``.
        query: the attending position ``i``.
        keys: one key position or several; their weights are summed.

    Returns:
        ``(...)`` shares in [0, 1], e.g. ``(num_layers, h)``.

    Example:
        >>> attention_share(torch.tensor([[0.5, 0.3, 0.2]]), 0, [1, 2]).item()
        0.5
    """
    check_tensor("attentions", attentions, floating=True, min_dim=2)
    num_queries = attentions.shape[-2]
    query = check_int("query", query)
    if not 0 <= query < num_queries:
        raise ValueError(f"query must be a position in [0, {num_queries}), got {query}")
    keys = _positions("keys", keys, attentions.shape[-1])
    return attentions[..., query, keys].sum(dim=-1)  # (...)


def top_heads(share: Tensor, k: int = 5) -> list[tuple[int, int, float]]:
    """The ``k`` largest entries of a ``(num_layers, h)`` table, largest first.

    Each entry is returned as ``(layer, head, value)``.

    Ties keep the order of ``torch.topk``; a NaN entry ranks first, as in ``topk``.

    Example:
        >>> top_heads(torch.tensor([[0.125, 0.75], [0.5, 0.25]]), k=2)
        [(0, 1, 0.75), (1, 0, 0.5)]
    """
    check_tensor("share", share, floating=True)
    if share.device.type == "meta":
        raise ValueError(
            "share must hold values to rank, got a tensor on the meta device"
        )
    if share.dim() != 2:
        raise ValueError(
            f"share must be a (num_layers, h) table, got shape {tuple(share.shape)}"
        )
    k = check_size("k", k)
    values, flat = share.flatten().topk(min(k, share.numel()))
    num_heads = share.shape[1]
    return [
        (int(f) // num_heads, int(f) % num_heads, float(v))
        for v, f in zip(values, flat, strict=True)
    ]
