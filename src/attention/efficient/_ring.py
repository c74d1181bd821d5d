"""The mechanics of ring attention (chapter 15).

Point-to-point exchanges between neighbouring ranks, and the autograd Function.

Private to :mod:`attention.efficient.distributed`, which validates the inputs, builds
the schedule and calls :class:`RingAttention`. Shapes: query ``(..., n_local, d)``, key
``(..., n_local, d)``, value ``(..., n_local, e)``, the shard of one rank.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from .._checks import broadcast_shapes
from .._core import max_shift, poisoned_rows
from ._tiled import backward, forward


def _merge(out: Tensor, lse: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    """Merge a block's partial ``(out_b, lse_b)`` into ``(out, lse)`` in place.

    The two are combined by log-sum-exp.
    """
    new = torch.logaddexp(lse, lse_b)  # (..., i)
    safe = max_shift(new)  # rows with no visible key so far: weights 0
    out.mul_(torch.exp(lse - safe).unsqueeze(-1)).add_(
        out_b * torch.exp(lse_b - safe).unsqueeze(-1)
    )
    lse.copy_(new)


class Ring:
    """One rank's view of the ring: its neighbours, and per step the tiles it computes.

    ``steps[t]`` lists ``(query slice, key slice, diagonal)``: local slices of the query
    shard and of the key/value block held at step ``t``; ``diagonal`` marks a chunk
    against itself, which takes the top-left causal mask.
    """

    def __init__(self, group, world_size: int, rank: int, steps: list):
        self.group, self.world_size, self.steps = group, world_size, steps
        self.next, self.prev = (rank + 1) % world_size, (rank - 1) % world_size

    def exchange(self, send: list[Tensor], recv: list[Tensor], tag: int) -> list:
        """Start the exchange with the neighbours; returns the works to wait on.

        ``send`` goes to the next rank and ``recv`` is filled by the previous one.
        """
        ops = [
            dist.P2POp(
                dist.isend, t, group=self.group, group_peer=self.next, tag=tag + k
            )
            for k, t in enumerate(send)
        ]
        ops += [
            dist.P2POp(
                dist.irecv, t, group=self.group, group_peer=self.prev, tag=tag + k
            )
            for k, t in enumerate(recv)
        ]
        return dist.batch_isend_irecv(ops) if ops else []


def _wait(works: list) -> None:
    for w in works:
        w.wait()


class RingAttention(torch.autograd.Function):
    """Ring attention on this rank's shard; backward sends dK/dV around the ring.

    Returns ``(out, poisoned)``: ``poisoned`` ``(..., n_local, 1)`` marks the queries
    with a NaN or ``+inf`` score against a key of any block, also one whose tile is
    skipped (the caller makes those rows NaN, the package's rule), or None.
    """

    @staticmethod
    def forward(ctx, query, key, value, ring, scale, block_size):
        batch = broadcast_shapes(
            "batch dims", query.shape[:-2], key.shape[:-2], value.shape[:-2]
        )
        opts = {"dtype": query.dtype, "device": query.device}
        out = torch.zeros((*batch, query.shape[-2], value.shape[-1]), **opts)
        lse = torch.full((*batch, query.shape[-2]), -math.inf, **opts)
        k_cur, v_cur = key.contiguous(), value.contiguous()
        poisoned = None
        for t, step in enumerate(ring.steps):
            works, k_next, v_next = [], None, None
            if (
                t < ring.world_size - 1
            ):  # prefetch the next block while this one is computed
                k_next, v_next = torch.empty_like(k_cur), torch.empty_like(v_cur)
                works = ring.exchange([k_cur, v_cur], [k_next, v_next], tag=0)
            for qa, kb, diagonal in step:
                q_a, k_b, v_b = query[..., qa, :], k_cur[..., kb, :], v_cur[..., kb, :]
                o, o_lse = forward(q_a, k_b, v_b, None, diagonal, scale, block_size)
                _merge(out[..., qa, :], lse[..., qa], o, o_lse)
            # every block passes by, even one whose tiles are skipped: check it
            bad = poisoned_rows(query, k_cur, scale, False)
            if bad is not None:
                poisoned = bad if poisoned is None else poisoned | bad
            _wait(works)
            if k_next is not None and v_next is not None:  # None after the last step
                k_cur, v_cur = k_next, v_next
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.options = (ring, scale, block_size)
        if poisoned is None:
            return out, None
        ctx.mark_non_differentiable(poisoned)
        return out, poisoned

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _):
        query, key, value, out, lse = ctx.saved_tensors
        ring, scale, block_size = ctx.options
        delta = (dout * out).sum(dim=-1)  # D = rowsum(dO * O), (..., n_local)
        dq = torch.zeros_like(query)
        k_cur, v_cur = key.contiguous(), value.contiguous()
        # sends of gradient accumulators in flight (and their buffers, kept alive)
        sends = []
        for t, step in enumerate(ring.steps):
            kv_works, acc_works = [], []
            if t < ring.world_size - 1:
                k_next, v_next = torch.empty_like(k_cur), torch.empty_like(v_cur)
                kv_works = ring.exchange([k_cur, v_cur], [k_next, v_next], tag=0)
            if t > 0:
                # the accumulators of the block held now, from its previous holder
                dk_acc, dv_acc = torch.empty_like(k_cur), torch.empty_like(v_cur)
                acc_works = ring.exchange([], [dk_acc, dv_acc], tag=2)
            dk_part, dv_part = torch.zeros_like(k_cur), torch.zeros_like(v_cur)
            for qa, kb, diagonal in step:
                q_a, k_b, v_b = query[..., qa, :], k_cur[..., kb, :], v_cur[..., kb, :]
                g = backward(
                    q_a, k_b, v_b, None, diagonal, scale, block_size,
                    lse[..., qa], dout[..., qa, :], delta[..., qa],
                )  # fmt: skip
                dq[..., qa, :] += g[0]
                dk_part[..., kb, :] += g[1]
                dv_part[..., kb, :] += g[2]
            _wait(acc_works)
            if t > 0:
                dk_part += dk_acc
                dv_part += dv_acc
            if (
                ring.world_size > 1
            ):  # pass them on; after the last step the next rank is their owner
                sends.append(
                    (ring.exchange([dk_part, dv_part], [], tag=2), dk_part, dv_part)
                )
            else:
                dk_own, dv_own = dk_part, dv_part
            _wait(kv_works)
            if t < ring.world_size - 1:
                k_cur, v_cur = k_next, v_next
        if (
            ring.world_size > 1
        ):  # our own block's accumulators, home from the previous rank
            dk_own, dv_own = torch.empty_like(key), torch.empty_like(value)
            _wait(ring.exchange([], [dk_own, dv_own], tag=2))
        _wait([w for works, *_ in sends for w in works])
        return dq, dk_own, dv_own, None, None, None
