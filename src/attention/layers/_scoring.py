"""Checks and the unchecked core shared by the score functions and the modules built on
them.

Used by :mod:`attention.layers.scoring`, :mod:`attention.layers.additive` and
:mod:`attention.layers.alignment`. Shapes: query ``(..., i, d_q)``, key
``(..., j, d_k)``, hidden size ``a``.
"""

from __future__ import annotations

from torch import Tensor

from .._checks import broadcast_shapes, check_like, check_qk, check_tensor


def check_pair(query, key, *, same_size: bool) -> None:
    """query ``(..., i, d_q)`` and key ``(..., j, d_k)`` with broadcasting batch
    dims."""
    check_qk(query, key, same_size=same_size)
    broadcast_shapes(
        "the batch dims of query and key", query.shape[:-2], key.shape[:-2]
    )


def check_feature_sizes(query: Tensor, key: Tensor, d_q: int, d_k: int) -> None:
    """Learnable scores: the last dims must be the sizes the parameters were built
    for."""
    check_pair(query, key, same_size=False)
    for name, t, size, size_name in (
        ("query", query, d_q, "d_q"),
        ("key", key, d_k, "d_k"),
    ):
        if t.shape[-1] != size:
            raise ValueError(
                f"{name} must have {size_name} = {size} features (its last dimension), "
                f"got {t.shape[-1]}"
            )


def check_param(
    name: str, p, shape: tuple[int, ...], shape_text: str, query: Tensor
) -> None:
    """A parameter tensor of exactly ``shape``, with the query's dtype and device."""
    check_tensor(name, p, floating=True)
    if tuple(p.shape) != shape:
        raise ValueError(
            f"{name} must have shape {shape_text} = {shape}, got {tuple(p.shape)}"
        )
    check_like("query", query, name, p)


def check_matrix(name: str, w, rows_name: str) -> None:
    check_tensor(name, w, floating=True)
    if w.dim() != 2:
        raise ValueError(
            f"{name} must be a 2-D ({rows_name}, d) matrix, got shape {tuple(w.shape)}"
        )


def additive_hidden_core(query, key, w_query, w_key, bias, act) -> Tensor:
    """Unchecked core of :func:`attention.layers.scoring.additive_hidden`:
    ``(..., i, j, a)``."""
    q = query @ w_query.transpose(0, 1)  # (..., i, a)
    if bias is not None:
        q = q + bias  # added once per query, not once per (query, key) pair
    k = key @ w_key.transpose(0, 1)  # (..., j, a)
    return act(q.unsqueeze(-2) + k.unsqueeze(-3))  # (..., i, j, a)
