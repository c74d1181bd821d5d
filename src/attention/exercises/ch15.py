"""Checkers for chapter 15's exercises: merging two partial attention results by their
log-sum-exps, the zigzag assignment of chunks to ranks, and one tile of the
FlashAttention-2 backward pass.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch15
    ch15.check_merge_partials(my_merge)

Shape legend: ``i`` queries, ``j`` keys, ``d`` query/key size, ``e`` value size,
``P`` ranks. The floating inputs are float64, built from real attention problems; the
expected answers are computed here from their definitions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..efficient.distributed import shard_sequence
from ._checker import Case, Mistake, Property, check, randn

__all__ = ["check_merge_partials", "check_zigzag_positions", "check_backward_tile"]

_INF = math.inf


def _part(q: Tensor, k: Tensor, v: Tensor, hidden: Tensor | None = None):
    """Attention of ``q`` over the keys ``k`` alone: ``(out, lse)``; a query whose keys
    are all ``hidden`` gets a zero output and ``lse = -inf``."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if hidden is not None:
        scores = scores.masked_fill(hidden, -_INF)
    lse = torch.logsumexp(scores, dim=-1)  # (..., i), -inf for a row of -inf
    weights = torch.exp(scores - lse.masked_fill(lse.isneginf(), 0.0)[..., None])
    return weights @ v, lse


# ------------------------------------------------------------------------ merge


def _merge(out1, lse1, out2, lse2):
    """The reference: rescale both parts to their common normaliser."""
    lse = torch.logaddexp(lse1, lse2)  # (..., i)
    shift = lse.masked_fill(lse.isneginf(), 0.0)
    w1, w2 = torch.exp(lse1 - shift), torch.exp(lse2 - shift)
    return w1[..., None] * out1 + w2[..., None] * out2, lse


def _merge_case(name: str, i, j1, j2, *, seed, scale=1.0, batch=(), empty=False):
    q = randn(*batch, i, 4, seed=seed, scale=scale)
    k1, k2 = randn(*batch, j1, 4, seed=seed + 1), randn(*batch, j2, 4, seed=seed + 2)
    v1, v2 = randn(*batch, j1, 3, seed=seed + 3), randn(*batch, j2, 3, seed=seed + 4)
    hidden = None
    if empty:  # the second part hides every key from the first two queries
        hidden = torch.zeros(i, j2, dtype=torch.bool)
        hidden[:2] = True
    return Case(name, (*_part(q, k1, v1), *_part(q, k2, v2, hidden)))


def _merge_cases() -> list[Case]:
    return [
        _merge_case("parts of 5 and 7 keys", 4, 5, 7, seed=80),
        _merge_case("parts of 1 and 9 keys", 3, 1, 9, seed=85),
        _merge_case("batch dims (2,)", 4, 6, 3, seed=90, batch=(2,)),
        _merge_case(
            "a part in which queries 0 and 1 see no key (lse = -inf, output 0)",
            4,
            5,
            6,
            seed=95,
            empty=True,
        ),
        _merge_case(
            "large scores (log-sum-exps near 1000)", 4, 5, 7, seed=100, scale=400.0
        ),
    ]


def _unnormalised(out1, lse1, out2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    return torch.exp(lse1)[..., None] * out1 + torch.exp(lse2)[..., None] * out2, lse


def _averaged(out1, lse1, out2, lse2):
    return (out1 + out2) / 2, torch.logaddexp(lse1, lse2)


def _lse_as_max(out1, lse1, out2, lse2):
    out, _ = _merge(out1, lse1, out2, lse2)
    return out, torch.maximum(lse1, lse2)


def _lse_as_sum(out1, lse1, out2, lse2):
    out, _ = _merge(out1, lse1, out2, lse2)
    return out, lse1 + lse2


def _weights_swapped(out1, lse1, out2, lse2):
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = torch.exp(lse1 - lse), torch.exp(lse2 - lse)
    return w2[..., None] * out1 + w1[..., None] * out2, lse


def check_merge_partials(fn) -> None:
    r"""Check ``fn(out1, lse1, out2, lse2) -> (out, lse)``: the ring's combine step.

    ``out1`` ``(..., i, e)`` and ``lse1`` ``(..., i)`` are attention of the queries over
    one part of the keys, with the log-sum-exp of each row's scores over that part;
    ``out2``, ``lse2`` the same over the other part. Attention over all the keys is

    .. math::

        \text{lse} = \log\bigl(e^{\text{lse}_1} + e^{\text{lse}_2}\bigr), \qquad
        \text{out} = e^{\text{lse}_1 - \text{lse}}\, \text{out}_1
                   + e^{\text{lse}_2 - \text{lse}}\, \text{out}_2 .

    A part in which a query sees no key has ``lse = -inf`` and output 0: it must not
    change that query's result. The inputs: parts of different sizes; batch dims; such
    an empty part; log-sum-exps near 1000 (``exp(lse)`` overflows). Known mistakes are
    named: unnormalised weights, the plain average, the log-sum-exp taken as the larger
    of the two or as their sum, the weights swapped.

    Example:
        >>> def my_merge(out1, lse1, out2, lse2):
        ...     lse = torch.logaddexp(lse1, lse2)
        ...     w1, w2 = torch.exp(lse1 - lse), torch.exp(lse2 - lse)
        ...     return w1[..., None] * out1 + w2[..., None] * out2, lse
        >>> check_merge_partials(my_merge)  # doctest: +ELLIPSIS
        ✓ my_merge: two partial results merged by log-sum-exp (5 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _merge,
        _merge_cases(),
        what="two partial results merged by log-sum-exp",
        outputs=("out", "lse"),
        mistakes=[
            Mistake(
                "the weights are not normalised: weigh each part by "
                "exp(lse_part - lse), with lse = logaddexp(lse1, lse2)",
                _unnormalised,
            ),
            Mistake(
                "the two outputs are averaged: weigh each by its share of the row's "
                "sum, exp(lse_part - lse)",
                _averaged,
            ),
            Mistake(
                "lse is the larger of the two: the sums add, lse = "
                "log(exp(lse1) + exp(lse2)) (torch.logaddexp)",
                _lse_as_max,
            ),
            Mistake(
                "the log-sum-exps are added: the sums add, not their logs; "
                "lse = log(exp(lse1) + exp(lse2))",
                _lse_as_sum,
            ),
            Mistake(
                "the weights are swapped: out1 gets exp(lse1 - lse)",
                _weights_swapped,
            ),
        ],
    )


# ------------------------------------------------------------------------ zigzag


def _zigzag(n: int, world_size: int, rank: int) -> Tensor:
    return shard_sequence(torch.arange(n), world_size, rank, layout="zigzag", dim=0)


def _chunks(n, world_size, rank, first, second, parts=None):
    parts = parts or 2 * world_size
    size = n // parts
    picked = [c for c in (first, second) if 0 <= c < parts]
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in picked])


def _zigzag_contiguous(n, world_size, rank):
    return _chunks(n, world_size, rank, 2 * rank, 2 * rank + 1)


def _zigzag_reversed(n, world_size, rank):
    return _chunks(n, world_size, rank, 2 * world_size - 1 - rank, rank)


def _zigzag_off_by_one(n, world_size, rank):
    return _chunks(n, world_size, rank, rank, 2 * world_size - 2 - rank)


def _zigzag_of_p_chunks(n, world_size, rank):
    return _chunks(n, world_size, rank, rank, world_size - 1 - rank, world_size)


def _distinct(out, n, world_size, rank):
    if out.dtype == torch.bool or out.is_floating_point():
        return True  # the dtype is reported first
    return out.unique().numel() == out.numel()


def check_zigzag_positions(fn) -> None:
    r"""Check ``fn(n, world_size, rank)``: the positions a rank holds, zigzag layout.

    The sequence ``0 .. n - 1`` is cut into ``2P`` chunks of ``n / (2P)`` positions
    (``P = world_size``; ``n`` is a multiple of ``2P``). Rank ``r`` holds chunk ``r``
    followed by chunk ``2P - 1 - r``: the first with the last, the second with the
    second to last, so that every rank gets the same causal work. ``fn`` returns a long
    tensor of the ``n / P`` positions, in that order. This is
    :func:`~attention.efficient.distributed.shard_sequence` with ``layout="zigzag"``
    applied to ``torch.arange(n)``. The inputs: every rank of ``P = 4``; ``P = 3``;
    ``P = 2``; ``P = 1`` (the whole sequence). Known mistakes are named: two
    neighbouring chunks, the order reversed, the partner chunk off by one, ``P``
    chunks instead of ``2P``.

    Example:
        >>> def my_zigzag_positions(n, world_size, rank):
        ...     size = n // (2 * world_size)
        ...     chunks = (rank, 2 * world_size - 1 - rank)
        ...     parts = [torch.arange(c * size, (c + 1) * size) for c in chunks]
        ...     return torch.cat(parts)
        >>> check_zigzag_positions(my_zigzag_positions)  # doctest: +ELLIPSIS
        ✓ my_zigzag_positions: chunks r and 2P - 1 - r (7 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        _zigzag,
        [
            Case("n = 16, P = 4, rank 0", (16, 4, 0)),
            Case("n = 16, P = 4, rank 1", (16, 4, 1)),
            Case("n = 16, P = 4, rank 3", (16, 4, 3)),
            Case("n = 24, P = 3, rank 2", (24, 3, 2)),
            Case("n = 12, P = 2, rank 1", (12, 2, 1)),
            Case("n = 32, P = 4, rank 2", (32, 4, 2)),
            Case("n = 8, P = 1: the whole sequence", (8, 1, 0)),
        ],
        what="chunks r and 2P - 1 - r",
        properties=[Property("a rank holds each position once", _distinct)],
        mistakes=[
            Mistake(
                "two neighbouring chunks: pair chunk r with chunk 2P - 1 - r, an early "
                "chunk with a late one",
                _zigzag_contiguous,
            ),
            Mistake(
                "the chunks are in the wrong order: chunk r first, then 2P - 1 - r",
                _zigzag_reversed,
            ),
            Mistake(
                "the partner chunk is off by one: the chunks are numbered 0 .. 2P - 1, "
                "so rank r's partner is 2P - 1 - r",
                _zigzag_off_by_one,
            ),
            Mistake(
                "the sequence is cut into P chunks: zigzag cuts it into 2P chunks of "
                "n / (2P) positions, two per rank",
                _zigzag_of_p_chunks,
            ),
        ],
    )


# ------------------------------------------------------------------------ backward


def _tile(q, k, v, d_out, lse, delta, scale):
    """The reference: one key block's share of dQ, and its dK and dV."""
    p = torch.exp(q @ k.transpose(-2, -1) * scale - lse[..., None])  # (..., i, blk)
    dv = p.transpose(-2, -1) @ d_out
    ds = p * (d_out @ v.transpose(-2, -1) - delta[..., None])
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


def _tile_case(name: str, j0: int, j1: int, *, seed: int, scale=None, batch=()):
    """A whole attention problem (5 queries, 9 keys), and the tile of keys j0:j1."""
    q, k = randn(*batch, 5, 4, seed=seed), randn(*batch, 9, 4, seed=seed + 1)
    v, d_out = randn(*batch, 9, 3, seed=seed + 2), randn(*batch, 5, 3, seed=seed + 3)
    scale = 1 / math.sqrt(4) if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.softmax(scores, dim=-1) @ v
    delta = (d_out * out).sum(-1)
    tile = slice(j0, j1)
    return Case(name, (q, k[..., tile, :], v[..., tile, :], d_out, lse, delta, scale))


def _tile_without_delta(q, k, v, d_out, lse, delta, scale):
    return _tile(q, k, v, d_out, lse, torch.zeros_like(delta), scale)


def _tile_renormalised(q, k, v, d_out, lse, delta, scale):
    local = torch.logsumexp(q @ k.transpose(-2, -1) * scale, dim=-1)
    return _tile(q, k, v, d_out, local, delta, scale)


def _tile_unscaled_gradients(q, k, v, d_out, lse, delta, scale):
    dq, dk, dv = _tile(q, k, v, d_out, lse, delta, scale)
    return dq / scale, dk / scale, dv


def _tile_unscaled_scores(q, k, v, d_out, lse, delta, scale):
    p = torch.exp(q @ k.transpose(-2, -1) - lse[..., None])
    dv = p.transpose(-2, -1) @ d_out
    ds = p * (d_out @ v.transpose(-2, -1) - delta[..., None])
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv


def check_backward_tile(fn) -> None:
    r"""Check ``fn(q, k, v, d_out, lse, delta, scale) -> (dq, dk, dv)``: one tile.

    The FlashAttention-2 backward pass for one block of keys and values ``k``
    ``(..., blk, d)`` and ``v`` ``(..., blk, e)``, against all queries ``q``
    ``(..., i, d)``, given the output gradient ``d_out`` ``(..., i, e)``, the
    log-sum-exp ``lse`` ``(..., i)`` of each query's scores over *all* keys, and
    ``delta = rowsum(d_out * out)`` ``(..., i)``. Rebuild the tile's weights and
    compute its gradients:

    .. math::

        P = e^{s\, q k^\top - \text{lse}}, \quad dV = P^\top dO, \quad
        dS = P \circ (dO\, V^\top - D), \quad dQ_\text{part} = s\, dS\, K, \quad
        dK = s\, dS^\top Q .

    ``dq`` is this block's share of the queries' gradient (the shares of all blocks
    add up to it); ``dk`` and ``dv`` are the block's whole gradients. The inputs come
    from real attention problems: a block in the middle, the first block, a block of
    one key, a scale that is not :math:`1/\sqrt d`, batch dims. Known mistakes are
    named: ``delta`` left out, the weights renormalised within the tile, the scale
    missing from ``dq`` and ``dk`` or from the scores.

    Example:
        >>> def my_backward_tile(q, k, v, d_out, lse, delta, scale):
        ...     p = torch.exp(q @ k.transpose(-2, -1) * scale - lse[..., None])
        ...     ds = p * (d_out @ v.transpose(-2, -1) - delta[..., None])
        ...     dv = p.transpose(-2, -1) @ d_out
        ...     return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
        >>> check_backward_tile(my_backward_tile)  # doctest: +ELLIPSIS
        ✓ my_backward_tile: one key block's dQ share, dK and dV (5 inputs, ...)
    """
    __tracebackhide__ = True
    check(
        fn,
        _tile,
        [
            _tile_case("keys 3-6 of 9", 3, 7, seed=110),
            _tile_case("the first block, keys 0-2", 0, 3, seed=114),
            _tile_case("a block of one key", 8, 9, seed=118),
            _tile_case("scale 0.3, keys 4-8", 4, 9, seed=122, scale=0.3),
            _tile_case("batch dims (2,), keys 2-5", 2, 6, seed=126, batch=(2,)),
        ],
        what="one key block's dQ share, dK and dV",
        outputs=("dq", "dk", "dv"),
        mistakes=[
            Mistake(
                "delta is left out: dS = P * (dP - delta), with dP = d_out @ vᵀ "
                "(the softmax's backward subtracts each row's delta)",
                _tile_without_delta,
            ),
            Mistake(
                "the tile's weights are renormalised within the tile: rebuild them "
                "with the row's whole log-sum-exp, P = exp(s q kᵀ - lse)",
                _tile_renormalised,
            ),
            Mistake(
                "dq and dk miss the scale: the scores are s q kᵀ, so dq = s dS k and "
                "dk = s dSᵀ q",
                _tile_unscaled_gradients,
            ),
            Mistake(
                "the scores are not scaled: P = exp(scale * q kᵀ - lse)",
                _tile_unscaled_scores,
            ),
        ],
    )
