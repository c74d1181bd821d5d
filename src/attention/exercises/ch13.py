"""Checkers for chapter 13's exercises: a sliding-window mask, the block layout that
covers a pattern, and MoBA's choice of blocks by their mean key.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch13
    ch13.check_sliding_window_mask(my_window_mask)

Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``. Masks and layouts are compared
exactly; the floating inputs of the block choice are float64.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..efficient.learned_sparse import moba_attention
from ..efficient.patterns import (
    block_sparse_mask,
    dilated_mask,
    global_tokens_mask,
    sliding_window_mask,
)
from ..foundations.masks import causal_mask
from ._checker import Case, Mistake, Property, check, randn, random_mask

__all__ = ["check_sliding_window_mask", "check_block_layout", "check_top_k_blocks"]

# --------------------------------------------------------------------------- window


def _offsets(n: int) -> Tensor:
    """``(n, n)``: query position minus key position."""
    i = torch.arange(n)
    return i[:, None] - i[None, :]


def _window(n: int, w: int, is_causal: bool = False) -> Tensor:
    return sliding_window_mask(n, w, is_causal=is_causal)


def _window_one_short(n, w, is_causal=False):
    off = _offsets(n)
    return (off.abs() < w) & ((off >= 0) | (not is_causal))


def _window_one_long(n, w, is_causal=False):
    off = _offsets(n)
    return (off.abs() <= w + 1) & ((off >= 0) | (not is_causal))


def _window_as_total_width(n, w, is_causal=False):
    off = _offsets(n)
    return (off.abs() <= w // 2) & ((off >= 0) | (not is_causal))


def _window_never_causal(n, w, is_causal=False):
    return _offsets(n).abs() <= w


def _window_causal_flipped(n, w, is_causal=False):
    off = _offsets(n)
    return (off.abs() <= w) & ((off <= 0) | (not is_causal))


def _window_inverted(n, w, is_causal=False):
    return ~_window(n, w, is_causal)


def check_sliding_window_mask(fn) -> None:
    r"""Check ``fn(n, w, is_causal=False)``: the sliding-window mask of ``n`` positions.

    Query ``i`` may attend key ``j`` when :math:`|i - j| \le w`: ``w`` keys on each
    side and the query itself, ``2w + 1`` keys in all (fewer at the ends). With
    ``is_causal=True`` only the keys at or before the query stay: :math:`0 \le i - j
    \le w`, ``w + 1`` keys. ``fn`` returns a bool tensor ``(n, n)``, **True = may
    attend**. The inputs: a window inside the sequence; ``w = 0`` (the diagonal); a
    causal window; a window wider than the sequence (everything kept).

    Known mistakes are named: one key short or one key too many on each side (an
    off-by-one ``<`` or ``w + 1``), ``w`` read as the total width ``2w + 1`` (the
    convention of some libraries), ``is_causal`` ignored or flipped, True and False
    swapped.

    Example:
        >>> def my_window_mask(n, w, is_causal=False):
        ...     offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        ...     keep = offset.abs() <= w
        ...     return keep & (offset >= 0) if is_causal else keep
        >>> check_sliding_window_mask(my_window_mask)  # doctest: +ELLIPSIS
        ✓ my_window_mask: |i - j| <= w, causal too (5 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        _window,
        [
            Case("n = 12, w = 4", (12, 4)),
            Case("n = 6, w = 0: the query alone", (6, 0)),
            Case("n = 10, w = 3, causal", (10, 3), {"is_causal": True}),
            Case("n = 9, w = 4, causal", (9, 4), {"is_causal": True}),
            Case("n = 5, w = 7: wider than the sequence", (5, 7)),
        ],
        what="|i - j| <= w, causal too",
        properties=[
            Property(
                "every query must see itself (the diagonal is True)",
                lambda out, n, *_, **__: out.diagonal(),
            ),
        ],
        mistakes=[
            Mistake(
                "the mask looks inverted: True must mean may attend",
                _window_inverted,
            ),
            Mistake(
                "the window is one key short on each side: keep |i - j| <= w, not < w",
                _window_one_short,
            ),
            Mistake(
                "the window is one key too wide on each side: keep |i - j| <= w",
                _window_one_long,
            ),
            Mistake(
                "w counts the keys on each side (|i - j| <= w, 2w + 1 keys in all), "
                "not the window's total width",
                _window_as_total_width,
            ),
            Mistake(
                "is_causal is ignored: with is_causal=True hide the keys after the "
                "query (keep 0 <= i - j <= w)",
                _window_never_causal,
            ),
            Mistake(
                "the causal side is flipped: keep the keys at or before the query "
                "(j <= i), not after it",
                _window_causal_flipped,
            ),
        ],
    )


# --------------------------------------------------------------------------- layout


def _layout(mask: Tensor, block_size: int) -> Tensor:
    """The smallest block layout covering ``mask``: a tile is kept if any pair is."""
    i, j = mask.shape
    bi, bj = math.ceil(i / block_size), math.ceil(j / block_size)
    padded = F.pad(mask, (0, bj * block_size - j, 0, bi * block_size - i))
    tiles = padded.view(bi, block_size, bj, block_size)  # (query block, row, key ...)
    return tiles.any(dim=3).any(dim=1)


def _layout_all(mask, block_size):
    i, j = mask.shape
    bi, bj = math.ceil(i / block_size), math.ceil(j / block_size)
    padded = F.pad(mask, (0, bj * block_size - j, 0, bi * block_size - i))
    return padded.view(bi, block_size, bj, block_size).all(dim=3).all(dim=1)


def _layout_transposed(mask, block_size):
    return _layout(mask.T, block_size)


def _layout_whole_blocks_only(mask, block_size):
    i, j = mask.shape
    bi, bj = i // block_size, j // block_size
    cut = mask[: bi * block_size, : bj * block_size]
    return cut.reshape(bi, block_size, bj, block_size).any(dim=3).any(dim=1)


def _layout_strided(mask, block_size):
    """Sampling every ``block_size``-th pair instead of looking at the whole tile."""
    return mask[::block_size, ::block_size]


def _covers(out, mask, block_size):
    if out.dtype != torch.bool:
        return True  # the dtype is reported first
    return ~mask | block_sparse_mask(out, block_size, tuple(mask.shape))


def _layout_cases() -> list[Case]:
    causal = causal_mask(10)
    wide = random_mask(7, 9, seed=3, p=0.15)
    return [
        Case("sliding window, n = 16, w = 2, B = 4", (sliding_window_mask(16, 2), 4)),
        Case(
            "dilated window, n = 16, w = 2, r = 2, B = 2", (dilated_mask(16, 2, 2), 2)
        ),
        Case("causal, n = 10, B = 4 (a last block of 2)", (causal, 4)),
        Case("global tokens, n = 12, B = 3", (global_tokens_mask(12, 1, [0, 7]), 3)),
        Case("a sparse (7, 9) mask, B = 3", (wide, 3)),
    ]


def check_block_layout(fn) -> None:
    r"""Check ``fn(mask, block_size)``: the smallest block layout that covers a mask.

    ``mask`` is a bool ``(i, j)`` pattern (**True = may attend**). Cut it into tiles of
    ``block_size`` by ``block_size`` pairs (the last row and column of tiles may be
    shorter when ``i`` or ``j`` is not a multiple). ``fn`` returns a bool layout
    ``(ceil(i / B), ceil(j / B))``: rows are query blocks, columns key blocks, True
    where the tile holds at least one kept pair. A block-sparse kernel given this layout
    computes every kept pair (and the others in the kept tiles).

    Known mistakes are named: tiles kept only when all their pairs are (the layout no
    longer covers the mask), a transposed layout, the shorter last blocks dropped, one
    pair per tile looked at.

    Example:
        >>> import math, torch.nn.functional as F
        >>> def my_block_layout(mask, block_size):
        ...     i, j = mask.shape
        ...     bi, bj = math.ceil(i / block_size), math.ceil(j / block_size)
        ...     padded = F.pad(mask, (0, bj * block_size - j, 0, bi * block_size - i))
        ...     tiles = padded.view(bi, block_size, bj, block_size)
        ...     return tiles.any(dim=3).any(dim=1)
        >>> check_block_layout(my_block_layout)  # doctest: +ELLIPSIS
        ✓ my_block_layout: a tile is kept if any pair in it is (5 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        _layout,
        _layout_cases(),
        what="a tile is kept if any pair in it is",
        properties=[
            Property(
                "the layout must cover the mask: every kept pair lies in a kept tile",
                _covers,
            ),
        ],
        mistakes=[
            Mistake(
                "a tile is kept only when all its pairs are: keep it when any pair "
                "is, so that the layout covers the mask",
                _layout_all,
            ),
            Mistake(
                "the layout is transposed: rows are query blocks (the mask's rows), "
                "columns key blocks",
                _layout_transposed,
            ),
            Mistake(
                "the shorter last blocks are dropped: there are ceil(n / B) blocks; "
                "pad the mask with False to a multiple of B",
                _layout_whole_blocks_only,
            ),
            Mistake(
                "one pair per tile is looked at: a tile is kept if any of its "
                "B x B pairs is",
                _layout_strided,
            ),
        ],
    )


# --------------------------------------------------------------------------- blocks


def _choice(blocks: Tensor, nb: int) -> Tensor:
    """``(n, s)`` block numbers (``-1`` empty) as a bool table ``(n, nb)``."""
    table = torch.zeros(blocks.shape[0], nb + 1, dtype=torch.bool)
    table.scatter_(1, blocks.masked_fill(blocks < 0, nb), True)
    return table[:, :nb]


def _top_k_blocks(q: Tensor, k: Tensor, block_size: int, top_k: int) -> Tensor:
    """MoBA's choice (``attention.moba_attention``) as a ``(n, nb)`` table."""
    n = q.shape[0]
    _, blocks = moba_attention(
        q[None],
        k[None],
        k[None],
        block_size=block_size,
        top_k=top_k,
        return_block_indices=True,
    )
    return _choice(blocks[0], math.ceil(n / block_size))


def _block_scores(q, k, block_size, pool="mean"):
    """``(n, nb)`` scores of each query against each block's pooled key."""
    n, d = k.shape
    nb = math.ceil(n / block_size)
    padded = F.pad(k, (0, 0, 0, nb * block_size - n)).view(nb, block_size, d)
    if pool == "max":
        pooled = padded.amax(dim=1)
    else:
        counts = torch.full((nb, 1), float(block_size), dtype=k.dtype)
        counts[-1] = n - (nb - 1) * block_size
        pooled = padded.sum(dim=1) / counts
    return q @ pooled.T


def _pick(scores: Tensor, allowed: Tensor, count: int) -> Tensor:
    """A bool table of the ``count`` highest allowed scores per row."""
    ranked = scores.masked_fill(~allowed, float("-inf"))
    values, chosen = ranked.topk(min(count, ranked.shape[1]), dim=1)
    table = torch.zeros_like(allowed)
    table.scatter_(1, chosen, values > float("-inf"))
    return table


def _own_and_past(n, nb, block_size):
    own = torch.arange(n)[:, None] // block_size
    col = torch.arange(nb)[None, :]
    return own, col


def _blocks_with_future(q, k, block_size, top_k):
    n = q.shape[0]
    nb = math.ceil(n / block_size)
    own, col = _own_and_past(n, nb, block_size)
    chosen = _pick(_block_scores(q, k, block_size), col != own, top_k - 1)
    return chosen | (col == own)


def _blocks_without_own(q, k, block_size, top_k):
    n = q.shape[0]
    nb = math.ceil(n / block_size)
    own, col = _own_and_past(n, nb, block_size)
    return _pick(_block_scores(q, k, block_size), col < own, top_k)


def _blocks_own_competes(q, k, block_size, top_k):
    n = q.shape[0]
    nb = math.ceil(n / block_size)
    own, col = _own_and_past(n, nb, block_size)
    return _pick(_block_scores(q, k, block_size), col <= own, top_k)


def _blocks_one_too_many(q, k, block_size, top_k):
    n = q.shape[0]
    nb = math.ceil(n / block_size)
    own, col = _own_and_past(n, nb, block_size)
    return _pick(_block_scores(q, k, block_size), col < own, top_k) | (col == own)


def _blocks_by_max(q, k, block_size, top_k):
    n = q.shape[0]
    nb = math.ceil(n / block_size)
    own, col = _own_and_past(n, nb, block_size)
    scores = _block_scores(q, k, block_size, pool="max")
    return _pick(scores, col < own, top_k - 1) | (col == own)


def _has_own_block(out, q, k, block_size, top_k):
    n = q.shape[0]
    rows = torch.arange(n)
    own = rows // block_size
    if out.dtype != torch.bool or out.shape[1] <= int(own.max()):
        return True  # shape and dtype are reported first
    return out[rows, own]


def _no_future_block(out, q, k, block_size, top_k):
    if out.dtype != torch.bool:
        return True
    own = torch.arange(q.shape[0])[:, None] // block_size
    return ~out | (torch.arange(out.shape[1])[None, :] <= own)


def _at_most_top_k(out, q, k, block_size, top_k):
    if out.dtype != torch.bool:
        return True
    return out.sum(dim=1) <= top_k


def _blocks_case(name, n, d, block_size, top_k, seed) -> Case:
    q, k = randn(n, d, seed=seed), randn(n, d, seed=seed + 1)
    return Case(name, (q, k, block_size, top_k))


def check_top_k_blocks(fn) -> None:
    r"""Check ``fn(q, k, block_size, top_k)``: MoBA's choice of blocks for each query.

    The keys ``k`` ``(n, d)`` are cut into blocks of ``block_size`` positions (the last
    may be shorter); block ``c``'s summary is its mean key :math:`\bar k_c`. Query ``t``
    (a row of ``q``, ``(n, d)``) lies in block ``t // block_size``, which it always
    keeps. Of the blocks before it, it keeps the ``top_k - 1`` whose mean key scores
    highest, :math:`q_t \cdot \bar k_c` (all of them when there are fewer). A block
    after its own is never kept: it holds only future keys. ``fn`` returns a bool table
    ``(n, ceil(n / block_size))``, True where query ``t`` keeps block ``c``. This is
    :func:`attention.moba_attention`'s gate.

    The inputs: blocks that divide ``n`` and a shorter last block; ``top_k = 1`` (the
    own block alone); ``top_k`` larger than the number of blocks (every past block).
    Known mistakes are named: future blocks chosen, the own block forgotten, the own
    block made to compete (its mean holds future keys), ``top_k`` past blocks plus the
    own one, max-pooled keys. The inputs are float64, random: no ties.

    Example:
        >>> def my_top_k_blocks(q, k, block_size, top_k):
        ...     n, nb = q.shape[0], -(-q.shape[0] // block_size)
        ...     blocks = torch.arange(n) // block_size
        ...     sums = k.new_zeros(nb, k.shape[1]).index_add(0, blocks, k)
        ...     means = sums / torch.bincount(blocks, minlength=nb)[:, None]
        ...     scores = q @ means.T
        ...     own = (torch.arange(n) // block_size)[:, None]
        ...     past = torch.arange(nb)[None, :] < own
        ...     ranked = scores.masked_fill(~past, float("-inf"))
        ...     values, picked = ranked.topk(min(top_k - 1, nb), dim=1)
        ...     keep = torch.zeros(n, nb, dtype=torch.bool)
        ...     keep.scatter_(1, picked, values > float("-inf"))
        ...     return keep | (torch.arange(nb)[None, :] == own)
        >>> check_top_k_blocks(my_top_k_blocks)  # doctest: +ELLIPSIS
        ✓ my_top_k_blocks: own block + top_k - 1 past blocks by mean key (5 ...
    """
    __tracebackhide__ = True
    check(
        fn,
        _top_k_blocks,
        [
            _blocks_case("n = 12, B = 4, top_k = 2", 12, 4, 4, 2, seed=0),
            _blocks_case("n = 20, B = 4, top_k = 3", 20, 4, 4, 3, seed=2),
            _blocks_case(
                "n = 10, B = 3, top_k = 2 (a last block of 1)", 10, 3, 3, 2, 4
            ),
            _blocks_case("top_k = 1: the own block alone", 9, 4, 3, 1, seed=6),
            _blocks_case("top_k = 6, more than the 4 blocks", 16, 4, 4, 6, seed=8),
        ],
        what="own block + top_k - 1 past blocks by mean key",
        properties=[
            Property("the query's own block must always be kept", _has_own_block),
            Property(
                "a block after the query's own block holds only future keys: never "
                "keep it",
                _no_future_block,
            ),
            Property("a query keeps at most top_k blocks", _at_most_top_k),
        ],
        mistakes=[
            Mistake(
                "blocks after the query's own are chosen: only the blocks before it "
                "compete (c < t // block_size)",
                _blocks_with_future,
            ),
            Mistake(
                "the query's own block is missing: it is always kept, and counts as "
                "one of the top_k",
                _blocks_without_own,
            ),
            Mistake(
                "the own block competes with the others: keep it whatever its score "
                "(its mean holds future keys) and rank only the blocks before it",
                _blocks_own_competes,
            ),
            Mistake(
                "one block too many: top_k counts the own block, so choose top_k - 1 "
                "blocks before it",
                _blocks_one_too_many,
            ),
            Mistake(
                "the blocks are ranked by a max-pooled key: rank them by the query's "
                "dot product with their mean key",
                _blocks_by_max,
            ),
        ],
    )
