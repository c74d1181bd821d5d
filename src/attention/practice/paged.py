"""A paged key/value cache (chapter 18).

Fixed-size blocks, a free list, and a block table per sequence.

Shape legend: ``b`` batch (sequences decoded together), ``h`` query heads, ``h_kv``
key/value heads, ``i`` query positions, ``j`` key positions, ``d`` head size, ``s``
block size (positions per block).

A contiguous cache (:class:`attention.KVCache`) reserves ``max_len`` positions for every
sequence of the batch up front. When the sequences have different lengths, and when
nobody knows in advance how long a generated answer will be, most of that reservation is
never used. PagedAttention (Kwon et al., 2023, the memory manager of vLLM) borrows the
operating system's answer: split the cache into *blocks* of ``s`` positions, keep one
shared *pool* of blocks and a *free list*, and give each sequence a *block table* that
maps its logical block ``p // s`` to a physical block anywhere in the pool. A sequence
holds at most one partly filled block, so at most ``s - 1`` positions per sequence are
wasted, and a finished sequence hands its blocks back at once.

Position ``p`` of a sequence lives in slot ``table[p // s] * s + p % s`` of the
flattened pool; attention reads the keys and values through that indirection, so the
order of the physical blocks does not matter: the result equals that of a contiguous
cache.

The pool is written in place, so the cache is for inference: use it under
``torch.inference_mode()`` or ``torch.no_grad()``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._cache import CacheBuffers, check_new_kv, zero_buffers
from .._checks import check_scale, check_sizes, check_tensor
from ..foundations.scaled_dot_product import scaled_dot_product_attention

__all__ = ["PagedKVCache"]


class _UnknownSequence(KeyError, ValueError):
    """A sequence id the cache does not hold.

    Catch it as ``KeyError`` or as ``ValueError``.
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class _PoolExhausted(ValueError, RuntimeError):
    """The pool has too few free blocks for a request.

    Both a ``ValueError`` and a ``RuntimeError``.
    """


class PagedKVCache(CacheBuffers):
    """Keys and values of many sequences in one pool of fixed-size blocks.

    Args:
        num_blocks: blocks in the pool.
        block_size: ``s``, positions per block.
        num_kv_heads: ``h_kv``.
        head_dim: ``d`` (keys and values share it).
        dtype: element type of the pool (default ``torch.get_default_dtype()``).
        device: where the pool lives.

    Attributes:
        keys, values: the pool, ``(num_blocks, s, h_kv, d)`` each (the layout of vLLM:
            one block is ``s`` consecutive positions).
        free_blocks: ids of the unused blocks; :meth:`append` takes them from the front.
        block_tables: ``{seq_id: [physical block ids]}``, logical block ``n`` of a
            sequence is ``block_tables[seq_id][n]``.
        lengths: ``{seq_id: positions stored}``.

    Example:
        >>> cache = PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=3)
        >>> a, b = cache.add_sequence(), cache.add_sequence()
        >>> three, one = torch.ones(1, 3, 3), torch.ones(1, 1, 3)  # (h_kv, n, d)
        >>> cache.append(a, three, three)  # 3 positions: 2 blocks
        >>> cache.append(b, one, one)  # 1 position: 1 block
        >>> cache.block_tables, cache.free_blocks
        ({0: [0, 1], 1: [2]}, [3])
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype | None = None,
        device=None,
    ) -> None:
        self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim = (
            check_sizes(
                num_blocks=num_blocks,
                block_size=block_size,
                num_kv_heads=num_kv_heads,
                head_dim=head_dim,
            )
        )
        shape = (self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        self.keys, self.values = zero_buffers(
            shape, dtype, device
        )  # (blocks, s, h_kv, d) each
        self.free_blocks: list[int] = list(range(self.num_blocks))
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self._next_id = 0

    # ------------------------------------------------------------------ bookkeeping

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block of keys plus its block of values."""
        return self.nbytes // self.num_blocks

    @property
    def blocks_in_use(self) -> int:
        """Blocks held by the sequences."""
        return self.num_blocks - len(self.free_blocks)

    def _check_id(self, seq_id) -> int:
        if isinstance(seq_id, bool) or not isinstance(seq_id, int):
            raise TypeError(
                f"a sequence id must be an int, got {type(seq_id).__name__}"
            )
        if seq_id not in self.block_tables:
            known = sorted(self.block_tables)
            raise _UnknownSequence(
                f"no sequence with id {seq_id} in the cache; known ids: {known} "
                "(add_sequence() returns a new id)"
            )
        return seq_id

    def add_sequence(self) -> int:
        """Start an empty sequence and return its id.

        No block is taken until the sequence has positions.
        """
        seq_id = self._next_id
        self._next_id += 1
        self.block_tables[seq_id] = []
        self.lengths[seq_id] = 0
        return seq_id

    def free(self, seq_id: int) -> None:
        """Forget a sequence and put its blocks back on the free list."""
        self._check_id(seq_id)
        self.free_blocks.extend(self.block_tables.pop(seq_id))
        del self.lengths[seq_id]

    def slots(self, seq_id: int) -> Tensor:
        """Flat pool slot of every position ``p`` of a sequence.

        The slot is ``table[p // s] * s + p % s``.

        Returns:
            ``(length,)`` int64 indices into ``keys.view(-1, h_kv, d)``.
        """
        self._check_id(seq_id)
        return self._slots(self.block_tables[seq_id], 0, self.lengths[seq_id])

    def _slots(self, table: list[int], start: int, stop: int) -> Tensor:
        pos = torch.arange(start, stop, device=self.device)  # (n,)
        blocks = torch.tensor(table, dtype=torch.long, device=self.device)
        return blocks[pos // self.block_size] * self.block_size + pos % self.block_size

    # ------------------------------------------------------------------ writing

    def append(self, seq_id: int, key: Tensor, value: Tensor) -> None:
        """Store ``n`` new positions of one sequence.

        Blocks are taken from the free list as needed.

        Args:
            seq_id: an id from :meth:`add_sequence`.
            key: ``(h_kv, n, d)`` keys of the new positions.
            value: ``(h_kv, n, d)`` their values.

        Raises:
            ValueError: for an unknown ``seq_id`` (also a ``KeyError``), for shapes that
                do not fit the pool, and when the free list has too few blocks (also a
                ``RuntimeError``); nothing is written then.
        """
        self._check_id(seq_id)
        check_new_kv(key, value, "(h_kv, n, d)", "the pool", self.keys)
        h_kv, n, d = key.shape
        if (h_kv, d) != (self.num_kv_heads, self.head_dim):
            raise ValueError(
                f"the pool holds {self.num_kv_heads} key/value heads of size "
                f"{self.head_dim}, got {h_kv} heads of size {d}"
            )
        table, start = self.block_tables[seq_id], self.lengths[seq_id]
        stop = start + n
        needed = -(-stop // self.block_size) - len(
            table
        )  # ceil(stop / s) - blocks held
        if needed > len(self.free_blocks):
            raise _PoolExhausted(
                f"the pool is full: sequence {seq_id} needs {needed} more block(s) of "
                f"{self.block_size} positions for {n} new positions, but only "
                f"{len(self.free_blocks)} of {self.num_blocks} blocks are free "
                "(free() finished sequences or build a larger pool)"
            )
        for _ in range(needed):
            table.append(self.free_blocks.pop(0))
        slots = self._slots(table, start, stop)  # (n,)
        flat = (-1, self.num_kv_heads, self.head_dim)
        self.keys.view(flat)[slots] = key.transpose(0, 1)  # (n, h_kv, d)
        self.values.view(flat)[slots] = value.transpose(0, 1)
        self.lengths[seq_id] = stop

    # ------------------------------------------------------------------ reading

    def gather(self, seq_id: int) -> tuple[Tensor, Tensor]:
        """The keys and values of one sequence, copied out in position order.

        Returns:
            ``(keys, values)``, each ``(h_kv, length, d)``: what a contiguous cache
            holds.
        """
        slots = self.slots(seq_id)  # (length,)
        flat = (-1, self.num_kv_heads, self.head_dim)
        keys = self.keys.view(flat)[slots].transpose(0, 1)  # (h_kv, length, d)
        values = self.values.view(flat)[slots].transpose(0, 1)
        return keys, values

    def attend(
        self,
        query: Tensor,
        seq_ids: list[int],
        *,
        is_causal: bool = False,
        scale: float | None = None,
    ) -> Tensor:
        r"""Attention of a batch of queries to their own sequences' cached positions.

        Query row ``q`` of sequence ``n`` is the position ``L_n - i + q`` (the newest
        ``i`` positions, already appended). It sees every stored position of its
        sequence, or, with ``is_causal``, the positions up to itself. The sequences are
        gathered through their block tables into a padded ``(b, h_kv, max L, d)`` batch
        and a padding mask hides the positions beyond each length (a real paged kernel
        reads the blocks in place instead of copying them; the arithmetic is the same).

        .. math::
            o_{n,q} = \operatorname{softmax}_j
                      \big(q \cdot k_{n,j} \cdot s + M_{nqj}\big)\, v_{n,j}

        Args:
            query: ``(b, h, i, d)`` with ``b = len(seq_ids)`` and ``h`` a multiple of
                ``h_kv`` (grouped-query attention when larger).
            seq_ids: the sequence of each batch row.
            is_causal: hide the positions after each query (bottom-right alignment).
            scale: multiplies the scores; default :math:`1/\sqrt{d}`.

        Returns:
            ``(b, h, i, d)``; empty for an empty batch (``seq_ids = []``, ``b = 0``),
            as torch's attention gives for a batch of zero.
        """
        check_tensor("query", query, floating=True)
        if not isinstance(seq_ids, (list, tuple)):
            raise TypeError(
                f"seq_ids must be a list of ints, got {type(seq_ids).__name__}"
            )
        for seq_id in seq_ids:
            self._check_id(seq_id)
        if not isinstance(is_causal, bool):
            raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
        if query.dim() != 4 or query.shape[0] != len(seq_ids):
            raise ValueError(
                "query must have shape (b, h, i, d) with b = len(seq_ids) = "
                f"{len(seq_ids)}, got {tuple(query.shape)}"
            )
        b, h, i, d = query.shape
        if d != self.head_dim or h % self.num_kv_heads:
            raise ValueError(
                f"query must have a multiple of {self.num_kv_heads} heads of size "
                f"{self.head_dim}, got {h} heads of size {d}"
            )
        if query.dtype != self.dtype or query.device != self.device:
            raise ValueError(
                "query must match the pool's dtype and device "
                f"({self.dtype}, {self.device}), got {query.dtype} on {query.device}"
            )
        if b == 0:  # no sequence this step: an empty batch, as torch's kernels give
            check_scale(scale)
            return query.new_zeros(query.shape)  # (0, h, i, d)
        lengths = torch.tensor(
            [self.lengths[s] for s in seq_ids], device=self.device
        )  # (b,)
        if i > int(lengths.min()):
            raise ValueError(
                f"the {i} queries must be the newest positions of each sequence, but a "
                f"sequence holds only {int(lengths.min())} (append them first)"
            )
        max_len = int(lengths.max())
        keys = self.keys.new_zeros(b, self.num_kv_heads, max_len, d)  # (b, h_kv, j, d)
        values = torch.zeros_like(keys)
        for row, seq_id in enumerate(seq_ids):
            k, v = self.gather(seq_id)  # (h_kv, L_n, d)
            keys[row, :, : k.shape[1]] = k
            values[row, :, : v.shape[1]] = v
        j = torch.arange(max_len, device=self.device)  # (j,)
        mask = j < lengths[:, None]  # (b, j): padding
        mask = mask[:, None, None, :].expand(b, 1, i, max_len)  # (b, 1, i, j)
        if is_causal:
            q_pos = lengths[:, None] - i + torch.arange(i, device=self.device)  # (b, i)
            mask = mask & (j <= q_pos[:, :, None])[:, None]  # (b, 1, i, j)
        return scaled_dot_product_attention(
            query, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
        )  # (b, h, i, d)

    def __repr__(self) -> str:
        return (
            f"PagedKVCache(num_blocks={self.num_blocks}, block_size={self.block_size}, "
            f"free={len(self.free_blocks)}, sequences={len(self.block_tables)}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"dtype={self.dtype})"
        )
