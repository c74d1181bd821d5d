r"""Attention across processes: ring attention over ``torch.distributed`` (chapter 15).

Shape legend: ``b`` batch (any number of leading dims), ``h`` heads, ``n`` the whole
sequence's length, ``n_local = n / P`` the positions one rank holds, ``d`` query/key
size, ``e`` value size, ``P`` the number of processes (ranks) in the group.

Sequence parallelism splits one long sequence over ``P`` processes. Each rank keeps its
shard of the queries for good; the key/value shards travel around a ring, one hop per
step, and each rank meets every key block once :cite:`liu2023ring`. The partial results
of the blocks merge exactly by their log-sum-exp, as in tiled attention
(:mod:`attention.efficient.tiled`):

.. math::

    \text{lse} = \log\left(e^{\text{lse}_1} + e^{\text{lse}_2}\right), \qquad
    O = e^{\text{lse}_1 - \text{lse}}\, O_1 + e^{\text{lse}_2 - \text{lse}}\, O_2.

The backward pass runs the same ring: key/value blocks travel again, and the gradient
accumulators ``dK``, ``dV`` of each block travel with it, so that when they come home
they hold the contributions of every rank's queries. With ``is_causal``, blocks that no
query of a rank can see are skipped; the ``"zigzag"`` layout gives every rank the same
amount of causal work :cite:`brandon2023striped`.

Mask convention: ``is_causal`` is the top-left causal mask over *global* positions (the
query at position ``p`` sees keys ``<= p``, wherever the two live), as
``is_causal=True`` in ``torch.nn.functional.scaled_dot_product_attention``.
:func:`ring_attention` refuses an ``attn_mask`` (boolean, True = may attend, in the rest
of the package): a mask over global positions would travel around the ring with the
keys.

The processes here are local CPU processes talking over gloo (``run_distributed``); the
same calls run unchanged over NCCL on GPUs.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor

from .._checks import (
    check_bool,
    check_int,
    check_tensor,
    validate_attention,
)
from .._core import default_scale, expand_kv_heads
from ._launch import run_distributed
from ._ring import Ring, RingAttention

# The facade re-exports the library names (the first 4); the teaching
# helpers after them are imported from this module's path by the chapters.
__all__ = [
    "ring_attention",
    "run_distributed",
    "shard_sequence",
    "unshard_sequence",
    "ring_forward_backward",
    "ring_schedule",
]

LAYOUTS = ("contiguous", "zigzag")


# ----------------------------------------------------------------------------- layouts


def _check_layout(layout) -> None:
    if not isinstance(layout, str):
        raise TypeError(f"layout must be a str, got {type(layout).__name__}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', got {layout!r}")


def _chunks_of(rank: int, world_size: int, layout: str) -> list[int]:
    """The global chunk indices rank ``rank`` holds, in its local order.

    The chunks are of equal size.
    """
    return [rank] if layout == "contiguous" else [rank, 2 * world_size - 1 - rank]


def _check_dim(x: Tensor, dim) -> int:
    dim = check_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"dim must lie in [{-x.dim()}, {x.dim() - 1}] for a {x.dim()}-d tensor, "
            f"got {dim}"
        )
    return dim % x.dim()


def _num_chunks(n: int, world_size: int, layout: str) -> int:
    parts = world_size if layout == "contiguous" else 2 * world_size
    if n % parts:
        rule = "P" if layout == "contiguous" else "2P"
        raise ValueError(
            f"the {layout} layout needs a sequence length n divisible by "
            f"{rule} = {parts}, got n = {n} for P = {world_size}"
        )
    return parts


def shard_sequence(
    x: Tensor, world_size: int, rank: int, *, layout: str = "contiguous", dim: int = -2
) -> Tensor:
    """The part of a sequence that rank ``rank`` of ``world_size`` holds.

    ``"contiguous"``: rank ``r`` holds positions ``[r n/P, (r + 1) n/P)``.
    ``"zigzag"``: the sequence is cut into ``2P`` chunks and rank ``r`` holds chunk
    ``r`` followed by chunk ``2P - 1 - r``, which balances causal work (rank 0 holds the
    first and the last chunk).

    Args:
        x: any tensor with the sequence along ``dim``, e.g. ``(b, h, n, d)``.
        world_size: the number of ranks ``P`` (``>= 1``).
        rank: this rank, ``0 <= rank < P``.
        layout: ``"contiguous"`` or ``"zigzag"``.
        dim: the sequence axis.

    Returns:
        ``x`` with ``n / P`` positions along ``dim`` (a view for ``"contiguous"``, a
        copy for ``"zigzag"``).

    Raises:
        ValueError: when ``n`` is not divisible by ``P`` (contiguous) or ``2P``
            (zigzag).

    Example:
        >>> positions = torch.arange(8)
        >>> [shard_sequence(positions, 2, r, layout="zigzag", dim=0).tolist()
        ...  for r in range(2)]
        [[0, 1, 6, 7], [2, 3, 4, 5]]
    """
    check_tensor("x", x, min_dim=1)
    world_size = check_int("world_size", world_size, minimum=1)
    rank = check_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size = {world_size}, got {rank}")
    _check_layout(layout)
    dim = _check_dim(x, dim)
    size = x.shape[dim] // _num_chunks(x.shape[dim], world_size, layout)
    pieces = [
        x.narrow(dim, c * size, size) for c in _chunks_of(rank, world_size, layout)
    ]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim)


def unshard_sequence(
    shards: Sequence[Tensor], *, layout: str = "contiguous", dim: int = -2
) -> Tensor:
    """Reassemble the whole sequence from every rank's shard.

    The inverse of :func:`shard_sequence`.

    Args:
        shards: the ``P`` shards in rank order, tensors of one shape, dtype and device.
        layout: the layout they were cut with, ``"contiguous"`` or ``"zigzag"``.
        dim: the sequence axis.

    Returns:
        The tensor of ``P * n_local`` positions along ``dim``, in sequence order.

    Example:
        >>> x = torch.arange(12).reshape(1, 12, 1)
        >>> shards = [shard_sequence(x, 3, r, layout="zigzag") for r in range(3)]
        >>> torch.equal(unshard_sequence(shards, layout="zigzag"), x)
        True
    """
    if (
        isinstance(shards, Tensor)
        or not isinstance(shards, Sequence)
        or len(shards) == 0
    ):
        raise TypeError(
            "shards must be a non-empty list or tuple of tensors, got "
            f"{type(shards).__name__}"
        )
    for r, s in enumerate(shards):
        check_tensor(f"shards[{r}]", s, min_dim=1)
    _check_layout(layout)
    first = shards[0]
    dim = _check_dim(first, dim)
    for r, s in enumerate(shards):
        if s.shape != first.shape or s.dtype != first.dtype or s.device != first.device:
            raise ValueError(
                "every shard must have one shape, dtype and device, got "
                f"{tuple(first.shape)} {first.dtype} {first.device} for rank 0 and "
                f"{tuple(s.shape)} {s.dtype} {s.device} for rank {r}"
            )
    world_size = len(shards)
    if layout == "contiguous":
        return torch.cat(list(shards), dim)
    if first.shape[dim] % 2:
        raise ValueError(
            "zigzag shards hold two chunks of equal length, got an odd length "
            f"{first.shape[dim]}"
        )
    halves = [s.chunk(2, dim) for s in shards]  # rank r: (chunk r, chunk 2P - 1 - r)
    ordered = [
        halves[c][0] if c < world_size else halves[2 * world_size - 1 - c][1]
        for c in range(2 * world_size)
    ]
    return torch.cat(ordered, dim)


def ring_schedule(
    world_size: int, *, layout: str = "contiguous", is_causal: bool = False
) -> list[list[dict]]:
    """Per step of the ring: the key/value block each rank holds, and what it computes.

    At step ``t`` rank ``r`` holds the key/value shard of rank ``(r - t) mod P``. Each
    (query chunk, key chunk) pair of that step is ``"full"``, ``"diagonal"`` (the causal
    triangle of one chunk with itself: half a tile) or skipped (every key after every
    query). :func:`ring_attention` runs exactly this schedule.

    Args:
        world_size: ``P``, the number of ranks.
        layout: ``"contiguous"`` (one chunk per rank) or ``"zigzag"`` (two).
        is_causal: whether keys after a query are masked.

    Returns:
        ``schedule[t][r]``, a dict with ``"source"`` (the rank whose keys are held) and
        ``"pairs"``: a list of ``(query chunk, key chunk, kind)`` with global chunk
        indices and kind ``"full"`` or ``"diagonal"``; skipped pairs are left out.

    Example:
        >>> # rank 1 holds the keys of ranks 1, 0, 2 in turn
        >>> [step[1]["source"] for step in ring_schedule(3)]
        [1, 0, 2]
        >>> # rank 0 never needs rank 1's keys
        >>> ring_schedule(2, is_causal=True)[1][0]["pairs"]
        []
    """
    world_size = check_int("world_size", world_size, minimum=1)
    _check_layout(layout)
    check_bool("is_causal", is_causal)
    schedule = []
    for t in range(world_size):
        step = []
        for r in range(world_size):
            source = (r - t) % world_size
            pairs = [
                (a, b, "full" if not is_causal or b < a else "diagonal")
                for a in _chunks_of(r, world_size, layout)
                for b in _chunks_of(source, world_size, layout)
                if not is_causal or b <= a
            ]
            step.append({"source": source, "pairs": pairs})
        schedule.append(step)
    return schedule


# --------------------------------------------------------------------------- the ring


def _steps(
    rank: int, world_size: int, layout: str, is_causal: bool, n_local: int
) -> list:
    """Per step of the ring, the tiles this rank computes.

    A tile is ``(query slice, key slice, diagonal)``. Slices are local: into the query
    shard and into the key/value block held at that step; ``diagonal`` marks a chunk
    against itself, which takes the top-left causal mask.
    """
    schedule = ring_schedule(world_size, layout=layout, is_causal=is_causal)
    if not is_causal:
        # every pair is full: one tile, the whole query shard against the whole block
        return [[(slice(None), slice(None), False)] for _ in schedule]
    size = n_local // len(_chunks_of(rank, world_size, layout))
    # global chunk index -> its slice within the shard of the rank holding it
    local = {}
    for r in range(world_size):
        for k, c in enumerate(_chunks_of(r, world_size, layout)):
            local[c] = slice(k * size, (k + 1) * size)
    return [
        [(local[a], local[b], kind == "diagonal") for a, b, kind in step[rank]["pairs"]]
        for step in schedule
    ]


def _local_problems(
    query, key, value, attn_mask, is_causal, scale, enable_gqa, layout, block_size
) -> None:
    """Every check that needs no communication; raises TypeError/ValueError."""
    validate_attention(query, key, value, None, is_causal, scale, enable_gqa)
    if attn_mask is not None:
        raise ValueError(
            "ring_attention takes no attn_mask: each rank holds a shard of the keys, "
            "and a mask over global positions would have to travel around the ring "
            "with them; pass is_causal=True for the causal mask, or use tiled_attention"
        )
    _check_layout(layout)
    check_int("block_size", block_size, minimum=1)


def _summary(query, key, value, is_causal, scale, enable_gqa, layout) -> tuple:
    """What must agree on every rank (shapes, dtype, options), cheap to gather."""

    def shape(t) -> tuple | str:
        return tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__

    real = isinstance(scale, numbers.Real) and not isinstance(scale, bool)
    return (shape(query), shape(key), shape(value), str(getattr(query, "dtype", None)),
            repr(is_causal), repr(float(scale)) if real else repr(scale),
            repr(enable_gqa), repr(layout))  # fmt: skip


def ring_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    group: dist.ProcessGroup | None = None,
    layout: str = "contiguous",
    block_size: int = 128,
) -> Tensor:
    r"""Ring attention: exact attention over a sequence split across ranks.

    Called on every rank of a process group ``group`` with that rank's shard of the
    sequence (as cut by :func:`shard_sequence` with the same ``layout``). At step
    ``t = 0 .. P-1`` rank ``r`` holds the key/value shard of rank ``(r - t) mod P``,
    computes attention of its queries against it with the tiled kernel of
    :func:`~attention.tiled_attention` while the shard moves on to the next rank
    (``torch.distributed`` point-to-point, started before the compute so the two overlap
    where the backend allows), and merges the partial result by log-sum-exp:

    .. math::

        O = \sum_t e^{\text{lse}_t - \text{lse}}\, O_t, \qquad
        \text{lse} = \log \sum_t e^{\text{lse}_t}.

    Differentiable: the backward pass (collective, every rank must call it) runs the
    ring again, recomputing each block's weights from the saved log-sum-exp, and sends
    each block's ``dK``, ``dV`` accumulators along with it until they return to their
    owner.

    Args:
        query: ``(..., h, n_local, d)``, this rank's queries.
        key: ``(..., h_kv, n_local, d)`` (any length when not causal).
        value: ``(..., h_kv, n_local, e)``.
        attn_mask: must be None (a ``ValueError`` says why): a mask over global
            positions would travel with the keys; use ``is_causal``.
        is_causal: top-left causal mask over *global* positions (query ``p`` sees keys
            ``<= p`` whatever the layout); key blocks that none of a rank's queries can
            see are skipped. A NaN or ``+inf`` score against a skipped key still makes
            its row NaN, as in the dense reference.
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.
        enable_gqa: grouped-query attention, ``h`` a multiple of ``h_kv``; each rank
            repeats its key/value heads for their query heads before the ring.
        group: the process group (default: the whole world); ``P`` is its size and the
            shard index is the rank within it.
        layout: how the sequence was cut, ``"contiguous"`` or ``"zigzag"``.
        block_size: keys per tile inside each block (memory per rank
            :math:`O(n_\text{local} \cdot \text{block})`).

    Returns:
        ``(..., n_local, e)``: this rank's shard of the output of attention over the
        whole sequence, equal to ``scaled_dot_product_attention`` on the unsharded
        inputs.

    Raises:
        ValueError: when no process group is initialised or this process is not in
            ``group``; when the shards differ in shape, dtype or options across ranks
            (found by one small ``all_gather`` before any block is sent, so every rank
            raises instead of waiting); when a zigzag shard has an odd length (``n`` not
            divisible by ``2P``).

    Example:
        >>> q = k = v = torch.randn(1, 2, 8, 4)
        >>> dist = torch.distributed
        >>> store = dist.HashStore()  # a one-process "group", for the doctest
        >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        >>> out = ring_attention(q, k, v, is_causal=True)
        >>> sdpa = torch.nn.functional.scaled_dot_product_attention
        >>> ref = sdpa(q, k, v, is_causal=True)
        >>> torch.allclose(out, ref, atol=1e-6)
        True
        >>> dist.destroy_process_group()
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "ring_attention needs an initialised process group: call "
            "torch.distributed.init_process_group first (or run it through "
            "run_distributed)"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(
            "group must be a torch.distributed.ProcessGroup or None, got "
            f"{type(group).__name__}"
        )
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError(
            "this process is not a member of the group passed to ring_attention"
        )
    problem = None
    try:
        _local_problems(
            query,
            key,
            value,
            attn_mask,
            is_causal,
            scale,
            enable_gqa,
            layout,
            block_size,
        )
    except (TypeError, ValueError) as err:
        problem = err
    # One cheap collective before any block moves: every rank learns every rank's shapes
    # and options, so that all of them raise together instead of waiting on a partner.
    mine = (
        _summary(query, key, value, is_causal, scale, enable_gqa, layout),
        None if problem is None else str(problem),
    )
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, mine, group=group)
    if problem is not None:
        raise problem
    for r, (summary, message) in enumerate(everyone):
        if message is not None:
            raise ValueError(f"rank {r} of the group rejected its inputs: {message}")
        if summary != everyone[0][0]:
            raise ValueError(
                "every rank must pass shards of one shape and dtype with the same "
                "is_causal, scale, enable_gqa and layout (shards of unequal length "
                "come from a sequence length n not divisible by "
                f"P = {world_size}); got "
                "(query, key, value, dtype, is_causal, scale, enable_gqa, layout) = "
                f"{everyone[0][0]} on rank 0 and {summary} on rank {r}"
            )
    n_q, n_k = query.shape[-2], key.shape[-2]
    if is_causal and n_q != n_k:
        raise ValueError(
            "with is_causal the query and key shards must have one length, got "
            f"{n_q} and {n_k}"
        )
    if layout == "zigzag" and (n_q % 2 or n_k % 2):
        raise ValueError(
            f"the zigzag layout needs n divisible by 2P = {2 * world_size}: each rank "
            "holds two chunks of equal length, got shards of length "
            f"{n_q} and {n_k}"
        )
    scale = default_scale(scale, query.shape[-1])
    if enable_gqa:  # (..., h_kv, n_local, *) -> (..., h, n_local, *)
        key = expand_kv_heads(key, query.shape[-3])
        value = expand_kv_heads(value, query.shape[-3])
    ring = Ring(
        group, world_size, rank, _steps(rank, world_size, layout, is_causal, n_k)
    )
    out, poisoned = RingAttention.apply(
        query, key, value, ring, scale, min(block_size, max(n_k, 1))
    )
    return out if poisoned is None else out.masked_fill(poisoned, math.nan)


def ring_forward_backward(
    rank: int,
    world_size: int,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    grad_output: Tensor,
    configs: Sequence[dict] = ({},),
) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """A worker for :func:`run_distributed`: ring attention forward and backward.

    It takes whole tensors. For each configuration, every rank cuts its shard of
    ``query``, ``key``, ``value`` ``(b, h, n, *)`` and of the output gradient with
    :func:`shard_sequence`, runs :func:`ring_attention` and its backward, then
    all-gathers the shards of the output and of the three gradients and reassembles them
    with :func:`unshard_sequence`. Several configurations share one start of the
    processes, which is the slow part.

    Args:
        rank, world_size: given by :func:`run_distributed`.
        query, key, value, grad_output: the whole sequence, the same on every rank.
        configs: dicts of :func:`ring_attention`'s keyword options (``is_causal``,
            ``scale``, ``layout``, ``block_size``), one run each.

    Returns:
        For each configuration, ``(output, grad_query, grad_key, grad_value)`` over the
        whole sequence (on every rank).
    """
    results = []
    for options in configs:
        layout = options.get("layout", "contiguous")
        shards = [shard_sequence(t, world_size, rank, layout=layout).detach().clone()
                  for t in (query, key, value, grad_output)]  # fmt: skip
        q, k, v = (t.requires_grad_() for t in shards[:3])
        out = ring_attention(q, k, v, **options)
        out.backward(shards[3])
        whole = []
        # backward has filled the three gradients
        grads = [cast(Tensor, t.grad) for t in (q, k, v)]
        for local in (out.detach(), *grads):
            parts = [torch.empty_like(local) for _ in range(world_size)]
            dist.all_gather(parts, local.contiguous())
            whole.append(unshard_sequence(parts, layout=layout))
        results.append(tuple(whole))
    return results
