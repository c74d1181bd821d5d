"""Chapter 13's exercise checkers, tried on functions a reader writes (the rows of
tests/test_exercises.py: see its docstring)."""

import math

import torch
import torch.nn.functional as F

from attention.exercises import ch13
from exercise_rows import Row

# --------------------------------------------------------------------------- window


def my_window_mask(n, w, is_causal=False):
    """Sliding-window mask of n positions: |i - j| <= w, True = may attend."""
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    keep = offset.abs() <= w
    return keep & (offset >= 0) if is_causal else keep


def my_window_mask_stub(n, w, is_causal=False):
    """Sliding-window mask of n positions: |i - j| <= w, True = may attend."""
    raise NotImplementedError("write your solution here")


def window_with_strict_inequality(n, w, is_causal=False):
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    keep = offset.abs() < w
    return keep & (offset >= 0) if is_causal else keep


def window_of_total_width_w(n, w, is_causal=False):
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    keep = offset.abs() <= w // 2
    return keep & (offset >= 0) if is_causal else keep


def window_that_forgets_is_causal(n, w, is_causal=False):
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    return offset.abs() <= w


def window_that_looks_ahead(n, w, is_causal=False):
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    keep = offset.abs() <= w
    return keep & (offset <= 0) if is_causal else keep


def window_as_ints(n, w, is_causal=False):
    return my_window_mask(n, w, is_causal).long()


# --------------------------------------------------------------------------- layout


def my_block_layout(mask, block_size):
    """The smallest block layout covering mask: a tile is kept if any pair in it is."""
    i, j = mask.shape
    bi, bj = math.ceil(i / block_size), math.ceil(j / block_size)
    padded = F.pad(mask, (0, bj * block_size - j, 0, bi * block_size - i))
    tiles = padded.view(bi, block_size, bj, block_size)
    return tiles.any(dim=3).any(dim=1)


def my_block_layout_stub(mask, block_size):
    """The smallest block layout covering mask: a tile is kept if any pair in it is."""
    raise NotImplementedError("write your solution here")


def layout_of_full_tiles(mask, block_size):
    i, j = mask.shape
    bi, bj = math.ceil(i / block_size), math.ceil(j / block_size)
    padded = F.pad(mask, (0, bj * block_size - j, 0, bi * block_size - i))
    return padded.view(bi, block_size, bj, block_size).all(dim=3).all(dim=1)


def layout_keys_by_queries(mask, block_size):
    return my_block_layout(mask.T, block_size)


def layout_with_floor_division(mask, block_size):
    i, j = mask.shape
    bi, bj = i // block_size, j // block_size
    cut = mask[: bi * block_size, : bj * block_size]
    return cut.reshape(bi, block_size, bj, block_size).any(dim=3).any(dim=1)


def layout_from_corners(mask, block_size):
    return mask[::block_size, ::block_size]


# --------------------------------------------------------------------------- blocks


def block_means(k, block_size):
    """The mean key of each block of block_size positions (the last may be shorter)."""
    n, d = k.shape
    nb = math.ceil(n / block_size)
    padded = F.pad(k, (0, 0, 0, nb * block_size - n)).view(nb, block_size, d)
    counts = torch.full((nb, 1), float(block_size), dtype=k.dtype)
    counts[-1] = n - (nb - 1) * block_size
    return padded.sum(dim=1) / counts


def my_top_k_blocks(q, k, block_size, top_k):
    """MoBA's gate: each query keeps its own block and the top_k - 1 best past ones."""
    n = q.shape[0]
    scores = q @ block_means(k, block_size).T  # (n, nb)
    nb = scores.shape[1]
    own = (torch.arange(n) // block_size)[:, None]  # (n, 1)
    past = torch.arange(nb)[None, :] < own  # (n, nb)
    ranked = scores.masked_fill(~past, float("-inf"))
    values, picked = ranked.topk(min(top_k - 1, nb), dim=1)
    keep = torch.zeros(n, nb, dtype=torch.bool)
    keep.scatter_(1, picked, values > float("-inf"))  # a -inf pick is no block
    return keep | (torch.arange(nb)[None, :] == own)


def my_top_k_blocks_stub(q, k, block_size, top_k):
    """MoBA's gate: each query keeps its own block and the top_k - 1 best past ones."""
    raise NotImplementedError("write your solution here")


def _choose(scores, allowed, count):
    ranked = scores.masked_fill(~allowed, float("-inf"))
    values, picked = ranked.topk(min(count, ranked.shape[1]), dim=1)
    keep = torch.zeros_like(allowed)
    keep.scatter_(1, picked, values > float("-inf"))
    return keep


def _grid(q, block_size):
    n = q.shape[0]
    nb = math.ceil(n / block_size)
    return (torch.arange(n) // block_size)[:, None], torch.arange(nb)[None, :]


def blocks_from_the_future_too(q, k, block_size, top_k):
    own, col = _grid(q, block_size)
    scores = q @ block_means(k, block_size).T
    return _choose(scores, col != own, top_k - 1) | (col == own)


def blocks_without_the_own_block(q, k, block_size, top_k):
    own, col = _grid(q, block_size)
    return _choose(q @ block_means(k, block_size).T, col < own, top_k)


def blocks_where_the_own_block_competes(q, k, block_size, top_k):
    own, col = _grid(q, block_size)
    return _choose(q @ block_means(k, block_size).T, col <= own, top_k)


def blocks_top_k_plus_own(q, k, block_size, top_k):
    own, col = _grid(q, block_size)
    scores = q @ block_means(k, block_size).T
    return _choose(scores, col < own, top_k) | (col == own)


def blocks_by_the_first_key(q, k, block_size, top_k):
    own, col = _grid(q, block_size)
    scores = q @ k[::block_size].T  # a block summarised by its first key
    return _choose(scores, col < own, top_k - 1) | (col == own)


ROWS = [
    Row(
        ch13.check_sliding_window_mask,
        my_window_mask,
        my_window_mask_stub,
        (
            (window_with_strict_inequality, "one key short on each side"),
            (window_of_total_width_w, "not the window's total width"),
            (window_that_forgets_is_causal, "is_causal is ignored"),
            (window_that_looks_ahead, "the causal side is flipped"),
            (window_as_ints, "a mask is a bool tensor"),
        ),
    ),
    Row(
        ch13.check_block_layout,
        my_block_layout,
        my_block_layout_stub,
        (
            (layout_of_full_tiles, "kept only when all its pairs are"),
            (layout_keys_by_queries, "the layout is transposed"),
            (layout_with_floor_division, "the shorter last blocks are dropped"),
            (layout_from_corners, "one pair per tile is looked at"),
        ),
    ),
    Row(
        ch13.check_top_k_blocks,
        my_top_k_blocks,
        my_top_k_blocks_stub,
        (
            (blocks_from_the_future_too, "blocks after the query's own are chosen"),
            (blocks_without_the_own_block, "own block is missing"),
            (blocks_where_the_own_block_competes, "the own block competes"),
            (blocks_top_k_plus_own, "one block too many"),
            (blocks_by_the_first_key, "is wrong at index"),
        ),
    ),
]
