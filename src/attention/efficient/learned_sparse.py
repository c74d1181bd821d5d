"""Attention that learns where to look: NSA, MoBA and DeepSeek's lightning indexer
(taught in chapter 13).

Fixed sparse patterns (:mod:`attention.efficient.patterns`) decide in advance which keys
a query sees. The methods here let the model decide, query by query, with a cheap score
that ranks blocks of keys or single keys, and then attend to the best ones only:

- :func:`native_sparse_attention` (NSA, Yuan et al. 2025): three branches, a compressed
  one over mean-pooled blocks, a selected one over the top-scoring blocks, a sliding
  window, mixed by per-head, per-token gates;
- :func:`moba_attention` (MoBA, Lu et al. 2025): each query keeps its own block and the
  past blocks whose mean key it scores highest;
- :func:`lightning_indexer` and :func:`deepseek_sparse_attention` (DSA, DeepSeek-V3.2):
  a small multi-head indexer scores every past token and the top-k tokens are attended;
- :func:`selection_mask` and :func:`selection_stats`: a selection as a mask, and how
  much of full attention's weight it holds.

Every function is causal self-attention: query ``t`` never sees a key after ``t``. The
semantics follow the reference implementations of flash-linear-attention (fla-core 0.6,
``fla/ops/nsa/naive.py``, ``fla/ops/dsa/naive.py``, ``fla/ops/moba/parallel.py``) and
MoBA's own reference; the tests compare with them. Each efficient form gathers only the
selected keys, a chunk of queries at a time (memory bounded by the chunk, not by
``n**2``), and equals a dense reference: the package's
:func:`~attention.scaled_dot_product_attention` with a boolean mask of the selection.

Shape legend: ``b`` batch (any number of leading dims ``...``), ``h`` query heads,
``h_kv`` key/value heads (``h`` a multiple of ``h_kv``: grouped-query attention, key
head ``g`` serving query heads ``g*r ... g*r + r - 1`` with ``r = h / h_kv``), ``n``
positions (queries and keys), ``d`` query/key size, ``e`` value size, ``B`` a block
size, ``nb = ceil(n / B)`` blocks (the last one may be shorter), ``s`` selected blocks
or keys per query, ``h_i`` indexer heads, ``d_i`` indexer size.

Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``. A selection is a tensor of block
(or key) numbers per query, sorted ascending, ``-1`` filling the unused slots.

Non-finite numbers follow the package's rule: a query whose score against any key
(selected or not, past or future) is NaN or ``+inf`` gets a NaN output, as the dense
reference with a mask gives; a NaN value reaches only the queries that attend to it.
A NaN ranking score ranks above every number, as in ``torch.topk``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._checks import (
    broadcast_shapes,
    check_bool,
    check_qkv,
    check_same_device,
    check_same_dtype,
    check_scale,
    check_size,
    check_tensor,
    validate_attention,
)
from .._core import (
    attention_scores,
    default_scale,
    expand_kv_heads,
    masked_softmax,
    poisoned_rows,
)
from ..foundations.scaled_dot_product import scaled_dot_product_attention
from .patterns import sliding_window_mask
from .sparse import sliding_window_attention

__all__ = [
    "native_sparse_attention",
    "moba_attention",
    "lightning_index_scores",
    "lightning_indexer",
    "deepseek_sparse_attention",
    "selection_mask",
    "SelectionStats",
    "selection_stats",
]

# Each step works on a chunk of queries whose temporaries hold about this many numbers:
# memory stays bounded whatever n is, yet the steps stay large enough to run fast.
_CHUNK_ELEMENTS = 1 << 23


def _chunks(n: int, per_query: int):
    """``(t0, t1)`` ranges of queries, each small enough for ``_CHUNK_ELEMENTS``."""
    step = max(1, _CHUNK_ELEMENTS // max(1, per_query))
    for t0 in range(0, n, step):
        yield t0, min(n, t0 + step)


# --------------------------------------------------------------------------- checks


def _check_self_attention(query, key, value, scale):
    """The boundary checks of the three attention functions.

    Returns query, key, value broadcast to one batch and flattened to ``(b, h, n, *)``,
    the original batch dims, and the scale as a float.
    """
    check_qkv(query, key, value)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dim() < 3:
            raise ValueError(
                f"{name} must have shape (..., heads, n, size), with a heads axis, "
                f"got shape {tuple(t.shape)}"
            )
    h, h_kv, n = query.shape[-3], key.shape[-3], query.shape[-2]
    if value.shape[-3] != h_kv:
        raise ValueError(
            "key and value must have the same number of heads h_kv, "
            f"got {h_kv} and {value.shape[-3]}"
        )
    if h_kv == 0 or h % h_kv != 0:
        raise ValueError(
            "the query heads h must be a multiple of the key/value heads h_kv "
            f"(grouped-query attention), got h={h} and h_kv={h_kv}"
        )
    if key.shape[-2] != n:
        raise ValueError(
            "causal self-attention: query and key must have the same number of "
            f"positions n, got {n} and {key.shape[-2]}"
        )
    scores_shape = validate_attention(query, key, value, None, False, scale, True)
    batch = scores_shape[:-3]
    flat = [_flat(t, batch, 3) for t in (query, key, value)]
    return (*flat, batch, default_scale(scale, query.shape[-1]))


def _flat(t: Tensor, batch, dims: int) -> Tensor:
    """``t`` with its last ``dims`` axes kept, broadcast to the batch dims ``batch`` and
    flattened to one batch axis: ``(..., *rest)`` -> ``(b, *rest)``."""
    rest = t.shape[t.dim() - dims :]
    return t.expand(*batch, *rest).reshape(math.prod(batch), *rest)


def _check_gate(name: str, gate, query: Tensor, batch, h: int, n: int):
    """``gate`` is None or a tensor like the query that broadcasts to ``(..., h, n)``;
    returns it broadcast and flattened to ``(b, h, n)`` (None stays None)."""
    if gate is None:
        return None
    check_tensor(name, gate, floating=True)
    check_same_dtype(query=query, **{name: gate})
    check_same_device(query=query, **{name: gate})
    target = (*batch, h, n)
    if broadcast_shapes(
        f"{name} and the (..., h, n) queries", gate.shape, target
    ) != torch.Size(target):
        raise ValueError(
            f"{name} must broadcast to the (..., h, n) = {target} queries, "
            f"got shape {tuple(gate.shape)}"
        )
    return _flat(gate.expand(target), batch, 2)


def _check_indices(name: str, indices) -> None:
    check_tensor(name, indices, min_dim=2)
    if (
        indices.dtype.is_floating_point
        or indices.dtype.is_complex
        or (indices.dtype == torch.bool)
    ):
        raise TypeError(f"{name} must have an integer dtype, got {indices.dtype}")


# --------------------------------------------------------------------------- pieces


def _mean_pool(x: Tensor, block_size: int) -> Tensor:
    """``(..., n, d)`` -> ``(..., nb, d)``: the mean of each block of ``block_size``
    positions; the last block, when shorter, is the mean of the positions it has."""
    n = x.shape[-2]
    nb = math.ceil(n / block_size)
    if nb == 1:  # (also when the block is longer than the sequence: no padding)
        return x.mean(dim=-2, keepdim=True)
    pad = nb * block_size - n  # < block_size <= n
    padded = F.pad(x, (0, 0, 0, pad))
    sums = padded.unflatten(-2, (nb, block_size)).sum(dim=-2)  # (..., nb, d)
    counts = torch.full((nb, 1), float(block_size), dtype=x.dtype, device=x.device)
    if pad:
        counts[-1] = block_size - pad
    return sums / counts


def _ascending(picks: Tensor) -> Tensor:
    """Sort each row of selected numbers ascending, the ``-1`` (empty) slots last."""
    big = torch.iinfo(picks.dtype).max
    ordered = picks.masked_fill(picks < 0, big).sort(dim=-1).values
    return ordered.masked_fill(ordered == big, -1)


def _attend_selected(
    q: Tensor, k: Tensor, v: Tensor, blocks: Tensor, block_size: int, scale: float
) -> Tensor:
    """Each query attends to the keys of its own list of blocks, at or before it.

    ``q`` is ``(b, h_kv, r, n, d)`` (the query heads grouped by key head), ``k`` and
    ``v`` are ``(b, h_kv, n, d)`` and ``(b, h_kv, n, e)``; ``blocks`` is
    ``(b, h_kv or 1, rows, n, s)`` with ``rows`` 1 (one list for the group's ``r``
    heads) or ``r`` (a list per head): block numbers, ``-1`` for an empty slot (with
    ``block_size = 1`` they are key positions). Query ``t`` sees key ``j`` iff the
    block of ``j`` is in its list and ``j <= t``. ``block_size <= n + 1``.

    How: the keys and values are cut into a table of blocks; for a chunk of queries,
    the listed blocks are copied out of it whole (``index_select``), and the heads that
    share a list multiply them as the rows of one matrix. Memory: a chunk of queries'
    blocks at a time. Returns ``(b, h_kv, r, n, e)``.
    """
    b, h_kv, r, n, d = q.shape
    e = v.shape[-1]
    rows, s = blocks.shape[-3], blocks.shape[-1]
    if n == 0:
        return q.new_zeros(b, h_kv, r, 0, e) + q.sum() * 0 + v.sum() * 0
    nb = math.ceil(n / block_size)
    pad = nb * block_size - n  # the last block's missing keys: zeros, never visible
    k_table = F.pad(k, (0, 0, 0, pad)).reshape(b * h_kv * nb, block_size, d)
    v_table = F.pad(v, (0, 0, 0, pad)).reshape(b * h_kv * nb, block_size, e)
    first = torch.arange(b * h_kv, device=q.device).view(b, h_kv, 1, 1, 1) * nb
    finite_values = bool(torch.isfinite(v).all())
    grouped = q.unflatten(2, (rows, r // rows))  # (b, h_kv, rows, r / rows, n, d)
    offsets = torch.arange(block_size, device=q.device)
    m = s * block_size  # keys per query
    pieces = []
    for t0, t1 in _chunks(n, b * h_kv * m * (rows * (d + e + 1) + 3 * r)):
        c = t1 - t0
        chosen = blocks[..., t0:t1, :]  # (b, ., rows, c, s)
        # which rows of the tables: (b, h_kv, rows, c, s), an empty slot reads block 0
        entries = (first + chosen.clamp(min=0)).expand(b, h_kv, rows, c, s).flatten()
        keys = k_table.index_select(0, entries).view(b, h_kv, rows, c, m, d)
        vals = v_table.index_select(0, entries).view(b, h_kv, rows, c, m, e)
        # (b, ., rows, c, m): the position of each gathered key
        pos = (chosen.unsqueeze(-1) * block_size + offsets).flatten(-2)
        t = torch.arange(t0, t1, device=q.device).view(-1, 1)  # (c, 1)
        visible = (pos >= 0) & (pos <= t)  # not an empty slot, not after the query
        if not finite_values:  # a hidden value must add nothing, not 0 * NaN
            vals = vals.masked_fill(~visible.unsqueeze(-1), 0.0)
        queries = grouped[..., t0:t1, :].transpose(-3, -2)  # (b, h_kv, rows, c, r', d)
        scores, _ = attention_scores(
            queries, keys, scale=scale
        )  # (b, h_kv, rows, c, r', m)
        scores = scores.masked_fill(~visible.unsqueeze(-2), float("-inf"))
        out = masked_softmax(scores) @ vals  # (b, h_kv, rows, c, r', e)
        pieces.append(out.transpose(-3, -2))  # (b, h_kv, rows, r', c, e)
    return torch.cat(pieces, dim=-2).flatten(2, 3)  # (b, h_kv, r, n, e)


def _poison(out: Tensor, query: Tensor, key: Tensor, scale: float) -> Tensor:
    """NaN in the rows of ``out`` (``(b, h, n, e)``) whose score against any key is NaN
    or ``+inf``: the rule of the dense reference (``_core.poisoned_rows``)."""
    bad = poisoned_rows(query, key, scale, True)
    return out if bad is None else out.masked_fill(bad, float("nan"))


def _gated_sum(terms) -> Tensor:
    """``sum(gate * branch)`` over ``(branch (b, h, n, e), gate (b, h, n) or None)``;
    a gate of None weighs its branch by 1."""
    total = None
    for branch, gate in terms:
        term = branch if gate is None else branch * gate.unsqueeze(-1)
        total = term if total is None else total + term
    assert total is not None  # at least one branch
    return total


# --------------------------------------------------------------------------- NSA


def _nsa_compress_and_select(
    q: Tensor,
    k_cmp: Tensor,
    v_cmp: Tensor,
    block_size: int,
    num_selected: int,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """NSA's compressed branch and its block selection.

    ``q`` is ``(b, h_kv, r, n, d)``, ``k_cmp`` and ``v_cmp`` the mean-pooled blocks
    ``(b, h_kv, nb, d)`` and ``(b, h_kv, nb, e)``. A block is visible to query ``t``
    once complete: ``(c + 1) * B - 1 <= t``. Returns the compressed output
    ``(b, h_kv, r, n, e)`` (zero before the first block is complete) and the selected
    blocks ``(b, h_kv, n, min(num_selected, nb))``, sorted, ``-1`` last.
    """
    b, h_kv, r, n, _ = q.shape
    nb = k_cmp.shape[-2]
    s = min(num_selected, nb)
    col = torch.arange(nb, device=q.device)  # (nb,)
    finite_values = bool(torch.isfinite(v_cmp).all())
    outs, picks = [], []
    for t0, t1 in _chunks(n, b * h_kv * nb * (4 * r + 2)):
        t = torch.arange(t0, t1, device=q.device).view(-1, 1)  # (c, 1)
        visible = (col + 1) * block_size - 1 <= t  # (c, nb)
        scores, _ = attention_scores(q[..., t0:t1, :], k_cmp.unsqueeze(2), scale=scale)
        probs = masked_softmax(scores, visible)  # (b, h_kv, r, c, nb)
        if finite_values:
            outs.append(probs @ v_cmp.unsqueeze(2))  # (b, h_kv, r, c, e)
        else:  # a block not yet complete must add nothing, not 0 * NaN
            # (b, h_kv, r, c, nb, e)
            terms = probs.unsqueeze(-1) * v_cmp[:, :, None, None]
            outs.append(terms.masked_fill(~visible.unsqueeze(-1), 0.0).sum(dim=-2))
        # one ranking per key/value group: the group's mean probability of each block
        rank = probs.detach().mean(dim=2).masked_fill(~visible, float("-inf"))
        # always kept, above any probability: own block, previous block, first block
        own = t // block_size
        forced = ((col == 0, 2.0), (col == own - 1, 3.0), (col == own, 4.0))
        for where, priority in forced:
            rank = rank.masked_fill(where, priority)
        values, chosen = rank.topk(s, dim=-1)  # (b, h_kv, c, s)
        picks.append(_ascending(chosen.masked_fill(torch.isneginf(values), -1)))
    if not outs:
        empty = q.new_zeros(b, h_kv, r, 0, v_cmp.shape[-1])
        return empty, torch.zeros(b, h_kv, 0, s, dtype=torch.long, device=q.device)
    return torch.cat(outs, dim=-2), torch.cat(picks, dim=-2)


def _nsa_core(q, k, v, gates, block_size, num_selected, window_size, scale):
    """Unchecked NSA on ``(b, h, n, *)`` tensors: ``(output, block indices)``."""
    b, h, n, d = q.shape
    h_kv = k.shape[-3]
    qg = q.unflatten(1, (h_kv, h // h_kv))  # (b, h_kv, r, n, d)
    k_cmp, v_cmp = _mean_pool(k, block_size), _mean_pool(v, block_size)
    o_cmp, blocks = _nsa_compress_and_select(
        qg, k_cmp, v_cmp, block_size, num_selected, scale
    )
    o_slc = _attend_selected(qg, k, v, blocks.unsqueeze(2), block_size, scale)
    terms = [(o_cmp.flatten(1, 2), gates[0]), (o_slc.flatten(1, 2), gates[1])]
    if window_size > 0:
        o_swa = sliding_window_attention(
            q, k, v, window=(window_size - 1, 0), scale=scale, enable_gqa=True
        )
        terms.append((o_swa, gates[2]))
    out = _gated_sum(terms)  # (b, h, n, e)
    if n:  # the selected branch's rows, then the compressed branch's
        out = _poison(_poison(out, q, k, scale), q, k_cmp, scale)
    return out, blocks


def native_sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    gate_compressed: Tensor | None = None,
    gate_selected: Tensor | None = None,
    gate_window: Tensor | None = None,
    block_size: int = 64,
    num_selected_blocks: int = 16,
    window_size: int = 0,
    scale: float | None = None,
    return_block_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Native Sparse Attention (NSA): compressed, selected and sliding-window branches.

    Causal self-attention in three branches, summed with per-head, per-token gates:
    :math:`o_t = g^{cmp}_t o^{cmp}_t + g^{slc}_t o^{slc}_t + g^{swa}_t o^{swa}_t`.

    - **Compressed**: the keys and values are cut into blocks of ``block_size``
      positions and mean-pooled (the paper learns this pooling with an MLP; the
      reference, fla-core's ``naive_nsa``, pools with a mean, as here). Query ``t``
      attends to the pooled blocks that are complete, ``(c + 1) * B - 1 <= t``; before
      the first block is complete it sees none and this branch gives 0.
    - **Selected**: the compressed branch's weights, averaged over the query heads of a
      key/value group, rank the blocks; the group keeps the ``num_selected_blocks``
      best, always including the first block, the query's own block and the previous
      block (``fla/ops/nsa/naive.py``, ``naive_nsa_topk``). Each query head attends to
      every key of those blocks at or before the query (causal inside its own block).
    - **Window**: the last ``window_size`` keys, the query included (flash-attn's
      ``window_size=(window_size - 1, 0)``, as the reference calls it); ``0`` turns
      the branch off.

    Args:
        query: ``(..., h, n, d)``.
        key: ``(..., h_kv, n, d)`` with ``h`` a multiple of ``h_kv``.
        value: ``(..., h_kv, n, e)``.
        gate_compressed, gate_selected, gate_window: ``(..., h, n)`` weights of the
            three branches (the paper makes them with an MLP and a sigmoid, fla-core's
            layer with a linear map and a sigmoid; any real number is accepted).
            ``None`` weighs the branch by 1, so the default is the plain sum of the
            branches. To drop the compressed branch from the sum, pass zeros (it is
            still computed: it ranks the blocks).
        block_size: ``B >= 1``, the size of both the pooled and the selected blocks
            (the reference uses one size; the paper allows two).
        num_selected_blocks: ``>= 1`` blocks kept per query and group, the forced ones
            included, at most ``nb`` (a larger value is clamped to ``nb``). Below 3 the
            forced blocks compete: own block first, then the previous, then the first.
        window_size: ``>= 0`` keys in the window branch (clamped to ``n``).
        scale: multiplies every score; default :math:`1/\sqrt{d}`.
        return_block_indices: also return the selected blocks.

    Returns:
        ``(..., h, n, e)``; with ``return_block_indices``, also the selected blocks
        ``(..., h_kv, n, min(num_selected_blocks, nb))`` (long), sorted ascending,
        ``-1`` in the unused slots (a query early in the sequence has fewer blocks to
        choose from).

    Raises:
        TypeError: non-tensors, non-floating or mixed dtypes, a non-int size, a gate of
            another dtype, a non-bool flag.
        ValueError: mismatched ``d``/``n``/heads, ``h`` not a multiple of ``h_kv``, a
            size below its minimum, a gate that does not broadcast to ``(..., h, n)``.

    Example:
        >>> q = torch.randn(1, 4, 10, 8); k, v = torch.randn(2, 1, 2, 10, 8)
        >>> out, blocks = native_sparse_attention(
        ...     q, k, v, block_size=4, num_selected_blocks=3, return_block_indices=True)
        >>> out.shape, blocks.shape
        (torch.Size([1, 4, 10, 8]), torch.Size([1, 2, 10, 3]))
        >>> blocks[0, 0, 9].tolist()  # query 9 sits in block 2: blocks 0, 1, 2 kept
        [0, 1, 2]
    """
    q, k, v, batch, scale_ = _check_self_attention(query, key, value, scale)
    h, n = q.shape[-3], q.shape[-2]
    gates = [
        _check_gate(name, g, query, batch, h, n)
        for name, g in (
            ("gate_compressed", gate_compressed),
            ("gate_selected", gate_selected),
            ("gate_window", gate_window),
        )
    ]
    block_size = check_size("block_size", block_size)
    num_selected = check_size("num_selected_blocks", num_selected_blocks)
    window_size = check_size("window_size", window_size, minimum=0)
    check_bool("return_block_indices", return_block_indices)
    # a block longer than the sequence: one block, never complete, as with n + 1
    block_size, window_size = min(block_size, n + 1), min(window_size, n)
    out, blocks = _nsa_core(
        q, k, v, gates, block_size, num_selected, window_size, scale_
    )
    out = out.reshape(*batch, *out.shape[-3:])
    if return_block_indices:
        return out, blocks.reshape(*batch, *blocks.shape[-3:])
    return out


def _nsa_dense_reference(
    query, key, value, gates, block_size, num_selected, window_size, scale=None
):
    """NSA with every branch as dense masked attention (``(b, h, n, *)`` inputs).

    The selection is taken from the efficient form (it is the same ranking); each branch
    is then :func:`scaled_dot_product_attention` with a boolean mask, **True = may
    attend**. For the tests.
    """
    h, n = query.shape[-3], query.shape[-2]
    _, blocks = _nsa_core(
        query,
        key,
        value,
        (None, None, None),
        block_size,
        num_selected,
        0,
        default_scale(scale, query.shape[-1]),
    )
    k_cmp, v_cmp = _mean_pool(key, block_size), _mean_pool(value, block_size)
    nb = k_cmp.shape[-2]
    complete = (torch.arange(nb) + 1) * block_size - 1 <= torch.arange(n)[:, None]
    o_cmp = scaled_dot_product_attention(
        query, k_cmp, v_cmp, complete, scale=scale, enable_gqa=True
    )
    chosen = expand_kv_heads(selection_mask(blocks, block_size=block_size), h)
    o_slc = scaled_dot_product_attention(
        query, key, value, chosen, scale=scale, enable_gqa=True
    )
    terms = [(o_cmp, gates[0]), (o_slc, gates[1])]
    if window_size > 0:
        band = sliding_window_mask(n, (window_size - 1, 0))
        o_swa = scaled_dot_product_attention(
            query, key, value, band, scale=scale, enable_gqa=True
        )
        terms.append((o_swa, gates[2]))
    return _gated_sum(terms), blocks


# --------------------------------------------------------------------------- MoBA


def _moba_select(qg: Tensor, k_pool: Tensor, block_size: int, top_k: int) -> Tensor:
    """MoBA's gate: ``(b, h_kv, r, n, min(top_k, nb))`` blocks per query head.

    The own block always; then the ``top_k - 1`` complete past blocks whose mean key
    scores highest against the query (an unscaled dot product, as MoBA's reference).
    """
    b, h_kv, r, n, _ = qg.shape
    nb = k_pool.shape[-2]
    s = min(top_k, nb)
    col = torch.arange(nb, device=qg.device)
    picks = []
    for t0, t1 in _chunks(n, b * h_kv * r * nb * 3):
        own = torch.arange(t0, t1, device=qg.device).view(-1, 1) // block_size  # (c, 1)
        gate = (qg[..., t0:t1, :] @ k_pool.unsqueeze(2).transpose(-1, -2)).detach()
        gate = gate.masked_fill(col >= own, float("-inf"))  # past, complete blocks only
        values, chosen = gate.topk(s - 1, dim=-1)  # (b, h_kv, r, c, s - 1)
        chosen = chosen.masked_fill(torch.isneginf(values), -1)
        own = own.expand(*chosen.shape[:-1], 1)
        picks.append(_ascending(torch.cat([chosen, own], dim=-1)))
    if not picks:
        return torch.zeros(b, h_kv, r, 0, s, dtype=torch.long, device=qg.device)
    return torch.cat(picks, dim=-2)


def moba_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    block_size: int,
    top_k: int,
    scale: float | None = None,
    return_block_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Mixture of Block Attention (MoBA): each query attends to ``top_k`` blocks.

    The keys are cut into blocks of ``block_size`` positions. Each query head keeps its
    own block, attended causally (keys at or before the query), and the ``top_k - 1``
    complete past blocks whose mean key scores highest against the query,
    :math:`q_t \cdot \bar k_c`, attended in full. ``top_k`` counts the own block, as in
    MoBA's reference (``moba_attn_varlen_naive``: the own block's gate is ``+inf``) and
    fla-core (``fla/ops/moba/parallel.py``: "the last chunk is always chosen by
    self-attn, so we only need ``topk - 1``"). ``top_k = 1`` is the own block alone;
    fla-core's ``parallel_moba`` instead falls back to full causal attention there.
    With ``top_k >= nb`` every past block is kept: full causal attention.

    Args:
        query: ``(..., h, n, d)``.
        key: ``(..., h_kv, n, d)`` with ``h`` a multiple of ``h_kv``; each query head
            makes its own choice against its key head's blocks.
        value: ``(..., h_kv, n, e)``.
        block_size: ``B >= 1``.
        top_k: ``>= 1`` blocks per query, the own block included (clamped to ``nb``).
        scale: multiplies the attention scores (not the gate); default
            :math:`1/\sqrt{d}`.
        return_block_indices: also return the blocks each query head attends to.

    Returns:
        ``(..., h, n, e)``; with ``return_block_indices``, also
        ``(..., h, n, min(top_k, nb))`` block numbers (long), sorted ascending, ``-1``
        in the unused slots.

    Raises:
        TypeError: non-tensors, non-floating or mixed dtypes, a non-int size, a
            non-bool flag.
        ValueError: mismatched ``d``/``n``/heads, ``h`` not a multiple of ``h_kv``, a
            size below 1.

    Example:
        >>> q, k, v = torch.randn(3, 1, 2, 9, 4)
        >>> from torch.nn.functional import scaled_dot_product_attention as sdpa
        >>> full = sdpa(q, k, v, is_causal=True)  # top_k = 3 blocks: all of them
        >>> out = moba_attention(q, k, v, block_size=4, top_k=3)
        >>> torch.allclose(out, full, atol=1e-6)
        True
    """
    q, k, v, batch, scale_ = _check_self_attention(query, key, value, scale)
    block_size = check_size("block_size", block_size)
    top_k = check_size("top_k", top_k)
    check_bool("return_block_indices", return_block_indices)
    h, h_kv = q.shape[-3], k.shape[-3]
    block_size = min(block_size, q.shape[-2] + 1)  # longer: one block, as with n + 1
    qg = q.unflatten(1, (h_kv, h // h_kv))  # (b, h_kv, r, n, d)
    blocks = _moba_select(qg, _mean_pool(k, block_size), block_size, top_k)
    out = _attend_selected(qg, k, v, blocks, block_size, scale_).flatten(1, 2)
    out = _poison(out, q, k, scale_).reshape(*batch, *out.shape[-3:])
    if return_block_indices:
        return out, blocks.flatten(1, 2).reshape(*batch, h, *blocks.shape[-2:])
    return out


def _moba_dense_reference(query, key, value, block_size, top_k, scale=None):
    """MoBA as dense attention with a mask of the selected blocks (``(b, h, n, *)``)."""
    h, h_kv = query.shape[-3], key.shape[-3]
    qg = query.unflatten(1, (h_kv, h // h_kv))
    blocks = _moba_select(qg, _mean_pool(key, block_size), block_size, top_k)
    chosen = selection_mask(blocks.flatten(1, 2), block_size=block_size)  # (b, h, n, n)
    return scaled_dot_product_attention(
        query, key, value, chosen, scale=scale, enable_gqa=True
    )


# --------------------------------------------------------------------------- DSA


def _check_indexer(index_query, index_key, index_weights, scale, activation):
    """Checks of the indexer's inputs; returns them as ``(b, h_i, n, d_i)``,
    ``(b, n, d_i)``, ``(b, h_i, n)`` or None, the batch dims, the scale and the
    activation."""
    check_tensor("index_query", index_query, floating=True, min_dim=3)
    check_tensor("index_key", index_key, floating=True, min_dim=2)
    check_same_dtype(
        index_query=index_query, index_key=index_key, index_weights=index_weights
    )
    check_same_device(
        index_query=index_query, index_key=index_key, index_weights=index_weights
    )
    h_i, n, d_i = index_query.shape[-3:]
    if index_key.dim() == index_query.dim():  # (..., 1, n, d_i): one shared key head
        if index_key.shape[-3] != 1:
            raise ValueError(
                "index_key holds one key per token, shared by the indexer heads: shape "
                f"(..., n, d_i) or (..., 1, n, d_i), got {tuple(index_key.shape)}"
            )
        index_key = index_key.squeeze(-3)
    elif index_key.dim() != index_query.dim() - 1:
        raise ValueError(
            "index_key holds one key per token, shared by the indexer heads: shape "
            f"(..., n, d_i) or (..., 1, n, d_i) for an index_query of shape "
            f"(..., h_i, n, d_i) = {tuple(index_query.shape)}, "
            f"got {tuple(index_key.shape)}"
        )
    if index_key.shape[-2:] != (n, d_i):
        raise ValueError(
            "index_key must have one row of size d_i per position: (n, d_i) = "
            f"{(n, d_i)}, got {tuple(index_key.shape[-2:])}"
        )
    shapes = [index_query.shape[:-3], index_key.shape[:-2]]
    if index_weights is not None:
        check_tensor("index_weights", index_weights, floating=True, min_dim=2)
        if index_weights.shape[-2:] != (h_i, n):
            raise ValueError(
                "index_weights must have shape (..., h_i, n) = "
                f"(..., {h_i}, {n}), got {tuple(index_weights.shape)}"
            )
        shapes.append(index_weights.shape[:-2])
    batch = broadcast_shapes(
        "the batch dims of index_query, index_key and index_weights", *shapes
    )
    check_scale(scale)
    if activation is None:
        activation = torch.relu
    elif not callable(activation):
        raise TypeError(
            "activation must be None (ReLU) or a callable applied to the scores, "
            f"got {type(activation).__name__} {activation!r}"
        )
    iq, ik = _flat(index_query, batch, 3), _flat(index_key, batch, 2)
    iw = None if index_weights is None else _flat(index_weights, batch, 2)
    return iq, ik, iw, batch, default_scale(scale, d_i), activation


def _index_scores(
    iq: Tensor,
    ik: Tensor,
    iw: Tensor | None,
    scale: float,
    activation,
    t0: int,
    t1: int,
) -> Tensor:
    """Index scores of queries ``t0 ... t1 - 1`` against every key: ``(b, c, n)``,
    ``-inf`` after the query: ``I[t, s] = sum_j w[j, t] act(scale q[j, t] . k[s])``,
    a weight of 1 per head when ``iw`` is None.
    """
    n = ik.shape[-2]
    # (b, h_i, c, n)
    raw, _ = attention_scores(iq[..., t0:t1, :], ik.unsqueeze(1), scale=scale)
    act = activation(raw)
    if not isinstance(act, Tensor) or act.shape != raw.shape:
        got = tuple(act.shape) if isinstance(act, Tensor) else type(act).__name__
        raise ValueError(
            "activation must map the (b, h_i, i, j) index scores to a tensor of the "
            f"same shape {tuple(raw.shape)}, got {got}"
        )
    summed = act.sum(dim=1) if iw is None else (act * iw[..., t0:t1, None]).sum(dim=1)
    positions = torch.arange(n, device=ik.device)
    future = positions > positions[t0:t1, None]  # (c, n)
    return summed.masked_fill(future, float("-inf"))  # (b, c, n)


def _indexer_core(iq, ik, iw, top_k, scale, activation) -> Tensor:
    """Unchecked :func:`lightning_indexer` on flat inputs: ``(b, n, min(top_k, n))``."""
    b, h_i, n, _ = iq.shape
    s = min(top_k, n)
    picks = []
    for t0, t1 in _chunks(n, b * n * (h_i * 3 + 2)):
        scores = _index_scores(iq, ik, iw, scale, activation, t0, t1)  # (b, c, n)
        values, chosen = scores.topk(s, dim=-1)
        picks.append(_ascending(chosen.masked_fill(torch.isneginf(values), -1)))
    if not picks:
        return torch.zeros(b, 0, s, dtype=torch.long, device=iq.device)
    return torch.cat(picks, dim=-2)


def lightning_index_scores(
    index_query: Tensor,
    index_key: Tensor,
    index_weights: Tensor | None = None,
    *,
    scale: float | None = None,
    activation: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    r"""The lightning indexer's scores :math:`I_{t,s}` of every query against every key.

    :math:`I_{t,s} = \sum_{j=1}^{h_i} w_{t,j}\,\mathrm{ReLU}(\text{scale}\;
    q^I_{t,j} \cdot k^I_s)` for :math:`s \le t` (DeepSeek-V3.2; fla-core's
    ``naive_dsa_indexer``), ``-inf`` for a key after the query. One index key per
    token is shared by the ``h_i`` indexer heads.

    Args:
        index_query: ``(..., h_i, n, d_i)``.
        index_key: ``(..., n, d_i)`` (or ``(..., 1, n, d_i)``).
        index_weights: ``(..., h_i, n)``, the weight of each indexer head for each
            query; None sums the heads with weight 1.
        scale: multiplies the dot products; default :math:`1/\sqrt{d_i}`.
        activation: applied to each head's scaled dot products; None is ReLU (the
            paper's). Any elementwise callable, e.g. ``torch.nn.Identity()``.

    Returns:
        ``(..., n, n)`` scores, ``-inf`` above the diagonal. It holds ``n**2`` numbers:
        for long sequences call :func:`lightning_indexer`, which keeps only the top-k.

    Example:
        >>> iq = torch.ones(1, 2, 3, 4); ik = torch.ones(1, 3, 4)
        >>> lightning_index_scores(iq, ik)[0].tolist()  # 2 heads * relu(4 / 2)
        [[4.0, -inf, -inf], [4.0, 4.0, -inf], [4.0, 4.0, 4.0]]
    """
    iq, ik, iw, batch, scale_, act = _check_indexer(
        index_query, index_key, index_weights, scale, activation
    )
    n = iq.shape[-2]
    scores = _index_scores(iq, ik, iw, scale_, act, 0, n)
    return scores.reshape(*batch, n, n)


def lightning_indexer(
    index_query: Tensor,
    index_key: Tensor,
    index_weights: Tensor | None = None,
    *,
    top_k: int,
    scale: float | None = None,
    activation: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    r"""DeepSeek's lightning indexer: the ``top_k`` past keys of each query.

    Ranks the keys at or before each query by :func:`lightning_index_scores` and keeps
    the ``top_k`` highest (fla-core's ``naive_dsa_indexer``). A query at position ``t``
    has only ``t + 1`` keys to choose from: its other slots hold ``-1``. The scores are
    computed a chunk of queries at a time, so memory does not grow as ``n**2``.
    With a positive scale and a non-decreasing activation, neither changes the ranking.

    Args:
        index_query: ``(..., h_i, n, d_i)``.
        index_key: ``(..., n, d_i)`` (or ``(..., 1, n, d_i)``), shared by the heads.
        index_weights: ``(..., h_i, n)`` or None (each head weighs 1).
        top_k: ``>= 1`` keys per query (clamped to ``n``).
        scale: multiplies the dot products; default :math:`1/\sqrt{d_i}`.
        activation: None (ReLU) or an elementwise callable.

    Returns:
        ``(..., n, min(top_k, n))`` key positions (long), sorted ascending, ``-1`` in
        the unused slots. A NaN score ranks above every number (as in ``torch.topk``);
        a key scored ``-inf`` is never selected.

    Example:
        >>> iq = torch.ones(1, 1, 4, 2)
        >>> ik = torch.tensor([[[1.0, 0], [3, 0], [2, 0], [0, 0]]])
        >>> lightning_indexer(iq, ik, top_k=2)[0].tolist()
        [[0, -1], [0, 1], [1, 2], [1, 2]]
    """
    iq, ik, iw, batch, scale_, act = _check_indexer(
        index_query, index_key, index_weights, scale, activation
    )
    top_k = check_size("top_k", top_k)
    picks = _indexer_core(iq, ik, iw, top_k, scale_, act)
    return picks.reshape(*batch, *picks.shape[-2:])


def deepseek_sparse_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    index_query: Tensor,
    index_key: Tensor,
    index_weights: Tensor | None = None,
    *,
    top_k: int,
    scale: float | None = None,
    return_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""DeepSeek Sparse Attention (DSA): attention to the keys the indexer selects.

    The :func:`lightning_indexer` (ReLU, its default scale :math:`1/\sqrt{d_i}`, as
    fla-core's ``naive_dsa`` calls it) picks ``top_k`` past keys per query; every query
    head attends to those keys only. The selection is shared by all query heads.
    The indexer's scores only rank: no gradient flows back to ``index_query``,
    ``index_key`` or ``index_weights`` (DeepSeek trains the indexer with a separate
    loss). With ``top_k >= n`` every past key is kept: full causal attention.

    Args:
        query: ``(..., h, n, d)``.
        key: ``(..., h_kv, n, d)`` with ``h`` a multiple of ``h_kv``.
        value: ``(..., h_kv, n, e)``.
        index_query: ``(..., h_i, n, d_i)``.
        index_key: ``(..., n, d_i)`` (or ``(..., 1, n, d_i)``).
        index_weights: ``(..., h_i, n)`` or None (each indexer head weighs 1).
        top_k: ``>= 1`` keys per query (clamped to ``n``).
        scale: multiplies the attention scores; default :math:`1/\sqrt{d}`.
        return_indices: also return the selected key positions.

    Returns:
        ``(..., h, n, e)``; with ``return_indices``, also ``(..., n, min(top_k, n))``
        key positions (long), sorted ascending, ``-1`` in the unused slots.

    Raises:
        TypeError: non-tensors, non-floating or mixed dtypes, a non-int ``top_k``, a
            non-bool flag.
        ValueError: mismatched sizes or heads, ``h`` not a multiple of ``h_kv``, index
            tensors whose positions or batch dims do not match the query's,
            ``top_k < 1``.

    Example:
        >>> q, k, v = torch.randn(3, 1, 4, 6, 8); iq = torch.randn(1, 2, 6, 3)
        >>> ik = torch.randn(1, 6, 3)
        >>> out, idx = deepseek_sparse_attention(
        ...     q, k, v, iq, ik, top_k=2, return_indices=True)
        >>> out.shape, idx.shape
        (torch.Size([1, 4, 6, 8]), torch.Size([1, 6, 2]))
    """
    q, k, v, batch, scale_ = _check_self_attention(query, key, value, scale)
    iq, ik, iw, index_batch, index_scale, activation = _check_indexer(
        index_query, index_key, index_weights, None, None
    )
    check_same_device(query=query, index_query=index_query)
    n = q.shape[-2]
    if iq.shape[-2] != n:
        raise ValueError(
            "index_query must have one row per position of the query: n = "
            f"{n}, got {iq.shape[-2]}"
        )
    both = broadcast_shapes(
        "the batch dims of query and index_query", batch, index_batch
    )
    if both != batch:
        raise ValueError(
            f"the index tensors' batch dims {tuple(index_batch)} must broadcast to the "
            f"query's {tuple(batch)}"
        )
    top_k = check_size("top_k", top_k)
    check_bool("return_indices", return_indices)
    with torch.no_grad():
        picks = _indexer_core(iq, ik, iw, top_k, index_scale, activation)  # (b', n, s)
    # (b, n, s): one selection per batch entry, shared by every head
    picks = _flat(picks.reshape(*index_batch, n, picks.shape[-1]), batch, 2)
    h, h_kv = q.shape[-3], k.shape[-3]
    qg = q.unflatten(1, (h_kv, h // h_kv))  # (b, h_kv, r, n, d)
    out = _attend_selected(qg, k, v, picks[:, None, None], 1, scale_).flatten(1, 2)
    out = _poison(out, q, k, scale_).reshape(*batch, *out.shape[-3:])
    if return_indices:
        return out, picks.reshape(*batch, *picks.shape[-2:])
    return out


def _dsa_dense_reference(
    query, key, value, index_query, index_key, index_weights, top_k, scale=None
):
    """DSA as dense attention with a mask of the selected keys (``(b, h, n, *)``)."""
    picks = lightning_indexer(index_query, index_key, index_weights, top_k=top_k)
    chosen = selection_mask(picks).unsqueeze(-3)  # (b, 1, n, n)
    return scaled_dot_product_attention(
        query, key, value, chosen, scale=scale, enable_gqa=True
    )


# --------------------------------------------------------------------------- measuring


def _membership(picks: Tensor, rows: range, n: int, block_size: int) -> Tensor:
    """``(..., c, n)`` boolean: key ``j`` is in a listed block of query ``t`` and
    ``j <= t``, for the queries ``t`` in ``rows`` (``picks`` is ``(..., c, s)``)."""
    nb = math.ceil(n / block_size)
    listed = picks.new_zeros(*picks.shape[:-1], nb + 1, dtype=torch.bool)
    listed.scatter_(-1, picks.masked_fill(picks < 0, nb), True)  # -1 fills column nb
    key_block = torch.arange(n, device=picks.device) // block_size  # (n,)
    t = torch.arange(rows.start, rows.stop, device=picks.device).view(-1, 1)
    return listed[..., key_block] & (torch.arange(n, device=picks.device) <= t)


def _check_picks(name: str, indices, block_size) -> int:
    """Block numbers ``(..., n, s)`` in ``[-1, nb - 1]``; returns the block size."""
    _check_indices(name, indices)
    block_size = check_size("block_size", block_size)
    n = indices.shape[-2]
    nb = math.ceil(n / block_size)
    if indices.numel() and indices.device.type != "meta":
        low, high = int(indices.min()), int(indices.max())
        if low < -1 or high >= nb:
            raise ValueError(
                f"{name} must lie in [-1, {nb - 1}] (-1 = an empty slot; {nb} blocks "
                f"of {block_size} positions for n = {n}), got values from {low} to "
                f"{high}"
            )
    return min(block_size, n + 1)  # longer blocks: one block, as with n + 1


def selection_mask(indices: Tensor, *, block_size: int = 1) -> Tensor:
    r"""A selection as a boolean mask (**True = may attend**): the keys each query sees.

    Query ``t`` may attend key ``j`` iff the block of ``j`` (``j // block_size``) is one
    of the numbers in row ``t`` of ``indices`` and ``j <= t`` (causal). With
    ``block_size=1`` the numbers are key positions. The mask, passed to
    :func:`~attention.scaled_dot_product_attention`, gives the selected-keys attention
    of :func:`native_sparse_attention` (its selected branch), :func:`moba_attention` and
    :func:`deepseek_sparse_attention`.

    Args:
        indices: ``(..., n, s)`` integers in ``[-1, nb - 1]``, ``-1`` an empty slot.
        block_size: ``>= 1``.

    Returns:
        ``(..., n, n)`` boolean mask.

    Example:
        >>> blocks = torch.tensor([[0, -1], [0, -1], [1, -1]])  # one block per query
        >>> selection_mask(blocks, block_size=2).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [0, 0, 1]], dtype=torch.int32)
    """
    block_size = _check_picks("indices", indices, block_size)
    n = indices.shape[-2]
    return _membership(indices.long(), range(n), n, block_size)


class SelectionStats(NamedTuple):
    """What a selection keeps of full causal attention, per query (``(..., h, n)``).

    ``mass``: the share of full attention's weight that falls on the selected keys (1.0
    when the selection holds every key with weight). ``keys_visited``: how many keys the
    selection lets the query see (selected and at or before it).
    """

    mass: Tensor
    keys_visited: Tensor


def selection_stats(
    query: Tensor,
    key: Tensor,
    selection: Tensor,
    *,
    block_size: int = 1,
    scale: float | None = None,
) -> SelectionStats:
    r"""How much of full causal attention a selection of keys holds, and its cost.

    Computes full causal attention's weights :math:`A_{t,j}` (a chunk of queries at a
    time) and, for each query and head, the mass :math:`\sum_{j \in S_t} A_{t,j}` of
    the selected keys :math:`S_t` and their number :math:`|S_t|` (keys at or before the
    query only). A retrieval measurement: a selection that holds the mass attends where
    full attention would.

    Args:
        query: ``(..., h, n, d)``.
        key: ``(..., h_kv, n, d)`` with ``h`` a multiple of ``h_kv``.
        selection: either a boolean mask (**True = selected**) broadcastable to
            ``(..., h, n, n)``, or integer block numbers (key positions when
            ``block_size=1``) ``(..., h_s, n, s)`` with ``h_s`` dividing ``h`` (``h_kv``
            for NSA's groups, ``h`` for MoBA) or ``(..., n, s)`` shared by all heads
            (DSA), ``-1`` for an empty slot.
        block_size: the block size of integer ``selection`` (ignored for a mask's
            meaning, but still checked).
        scale: multiplies the scores; default :math:`1/\sqrt{d}`.

    Returns:
        :class:`SelectionStats` of ``(..., h, n)`` tensors: ``mass`` (query's dtype) and
        ``keys_visited`` (long).

    Example:
        >>> q, k = torch.randn(2, 1, 2, 5, 4)
        >>> every = torch.arange(5).expand(1, 5, 5)  # every key, listed by position
        >>> stats = selection_stats(q, k, every)
        >>> torch.allclose(stats.mass, torch.ones(1, 2, 5))
        True
        >>> stats.keys_visited[0, 0].tolist()
        [1, 2, 3, 4, 5]
    """
    check_qkv(query, key)
    for name, t in (("query", query), ("key", key)):
        if t.dim() < 3:
            raise ValueError(
                f"{name} must have shape (..., heads, n, d), with a heads axis, "
                f"got shape {tuple(t.shape)}"
            )
    h, h_kv, n = query.shape[-3], key.shape[-3], query.shape[-2]
    if h_kv == 0 or h % h_kv != 0:
        raise ValueError(
            "the query heads h must be a multiple of the key/value heads h_kv "
            f"(grouped-query attention), got h={h} and h_kv={h_kv}"
        )
    if key.shape[-2] != n:
        raise ValueError(
            "causal self-attention: query and key must have the same number of "
            f"positions n, got {n} and {key.shape[-2]}"
        )
    scores_shape = validate_attention(query, key, key, None, False, scale, True)
    batch = scores_shape[:-3]
    check_tensor("selection", selection)
    check_same_device(query=query, selection=selection)
    if selection.dtype == torch.bool:
        check_size("block_size", block_size)
        if (
            broadcast_shapes(
                "selection and the (..., h, n, n) scores", selection.shape, scores_shape
            )
            != scores_shape
        ):
            raise ValueError(
                "a boolean selection must broadcast to the (..., h, n, n) scores "
                f"{tuple(scores_shape)}, got shape {tuple(selection.shape)}"
            )
        mask = _flat(selection.expand(scores_shape), batch, 3)  # (b, h, n, n)
        picks = None
    else:
        block_size = _check_picks("selection", selection, block_size)
        if selection.shape[-2] != n:
            raise ValueError(
                f"selection must have one row per query: n = {n}, "
                f"got {selection.shape[-2]}"
            )
        if selection.dim() == query.dim():
            h_s = selection.shape[-3]
            if h_s == 0 or h % h_s != 0:
                raise ValueError(
                    "the selection's heads must divide the query heads (1, h_kv or h), "
                    f"got {h_s} for h={h}"
                )
            sel_batch = selection.shape[:-3]
        elif selection.dim() == query.dim() - 1:
            h_s, sel_batch = 1, selection.shape[:-2]
        else:
            raise ValueError(
                "selection must be (..., h_s, n, s) or (..., n, s) for a query of "
                f"shape (..., h, n, d) = {tuple(query.shape)}, "
                f"got {tuple(selection.shape)}"
            )
        if (
            broadcast_shapes("the batch dims of query and selection", batch, sel_batch)
            != batch
        ):
            raise ValueError(
                f"the selection's batch dims {tuple(sel_batch)} must broadcast to the "
                f"query's {tuple(batch)}"
            )
        picks = selection.long().reshape(*sel_batch, h_s, *selection.shape[-2:])
        picks = _flat(picks, batch, 3)  # (b, h_s, n, s)
        mask = None
    scale_ = default_scale(scale, query.shape[-1])
    q = _flat(query, batch, 3)  # (b, h, n, d)
    k = expand_kv_heads(_flat(key, batch, 3), h)  # (b, h, n, d)
    positions = torch.arange(n, device=q.device)
    masses, counts = [], []
    for t0, t1 in _chunks(n, q.shape[0] * h * n * 4):
        causal = positions <= positions[t0:t1, None]  # (c, n)
        scores, _ = attention_scores(q[..., t0:t1, :], k, scale=scale_)  # (b, h, c, n)
        weights = masked_softmax(scores, causal)
        if mask is not None:
            chosen = mask[..., t0:t1, :] & causal  # (b, h, c, n)
        else:
            assert picks is not None  # given a selection, not a mask
            chosen = _membership(picks[..., t0:t1, :], range(t0, t1), n, block_size)
            chosen = expand_kv_heads(chosen, h)  # (b, h, c, n)
        masses.append((weights * chosen).sum(dim=-1))
        counts.append(chosen.sum(dim=-1))
    if not masses:
        empty = q.new_zeros(q.shape[0], h, 0)
        return SelectionStats(
            empty.reshape(*batch, h, 0), empty.long().reshape(*batch, h, 0)
        )
    mass = torch.cat(masses, dim=-1).reshape(*batch, h, n)
    return SelectionStats(mass, torch.cat(counts, dim=-1).reshape(*batch, h, n))
