"""Sparse attention patterns: which keys each query may see (taught in chapter 13).

Each builder returns a boolean mask, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``; it broadcasts to the
``(b, h, i, j)`` scores. The efficient kernels in :mod:`attention.efficient.sparse`
compute exactly what the dense reference computes with these masks, and are tested
against it.

Shape legend: ``i`` query positions (rows), ``j`` key positions (columns), ``n`` the
sequence length when ``i = j``; a block layout is ``(ceil(i / B), ceil(j / B))`` for a
block size ``B``.

Window convention (the one used throughout the book). ``window=w`` (an int) keeps the
keys with ``|p - k| <= w``, where ``p`` is the query's position: ``w`` keys on each side
of the query plus the query itself, ``2w + 1`` keys; causal, ``w`` keys before the query
plus the query, ``w + 1`` keys. ``window=(left, right)`` keeps
``p - left <= k <= p + right``, ``None`` meaning unbounded on that side; this is
flash-attn's ``window_size=(left, right)`` (which writes ``-1`` for unbounded). Hugging
Face's ``sliding_window=w`` counts the query itself: its causal sliding window is
``window=(w - 1, 0)`` here, and its bidirectional one (``|p - k| <= w``) is
``window=w``. Published window sizes follow different conventions: gpt-oss's reference
code masks ``p - k >= 128``, so its window of 128 keeps 128 keys, ``window=(127, 0)``
here; Hugging Face's ``sliding_window=4096`` for Mistral 7B v0.1 keeps 4096 keys,
``window=(4095, 0)``. Before converting another model's number, read how its own masking
code counts. With ``i != j`` the queries are the last ``i`` of the ``j`` positions
(bottom-right alignment, as in decoding with a cache): query ``a`` sits at position
``p = a + j - i``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import (
    check_bool,
    check_device,
    check_generator,
    check_int,
    check_size,
)
from .._core import tril_mask
from ._patterns import causal_bounds, check_layout, check_layout_fits, window_bounds

__all__ = [
    "sliding_window_mask",
    "dilated_mask",
    "global_tokens_mask",
    "bigbird_mask",
    "block_sparse_mask",
    "local_global_layout",
]


def _room_for(i: int, j: int, device) -> None:
    """An ``(i, j)`` boolean mask must fit in memory: find out before building it."""
    try:
        torch.empty(i, j, dtype=torch.bool, device=device)
    except (
        RuntimeError,
        OverflowError,
        TypeError,
    ):  # too large for memory, or for int64
        raise ValueError(f"an ({i}, {j}) mask does not fit in memory") from None


def _count_at_most(name: str, value, limit: int, limit_name: str) -> int:
    """A count in ``[0, limit]``."""
    value = check_int(name, value, minimum=0)
    if value > limit:
        raise ValueError(f"{name} must be <= {limit_name}={limit}, got {value}")
    return value


def _offsets(i: int, j: int, device) -> Tensor:
    """``(i, j)`` matrix of ``p - k``: query position (bottom-right aligned) minus key
    position."""
    query_pos = torch.arange(j - i, j, device=device)  # (i,)
    key_pos = torch.arange(j, device=device)  # (j,)
    return query_pos[:, None] - key_pos[None, :]  # (i, j)


def sliding_window_mask(
    i: int, window, *, j: int | None = None, is_causal: bool = False, device=None
) -> Tensor:
    """Local (sliding-window) mask of shape ``(i, j)``; True = may attend.

    Query ``p`` may see key ``k`` iff ``p - left <= k <= p + right``; an int
    ``window=w`` means ``left = right = w``, i.e. ``|p - k| <= w``: ``w`` keys on each
    side plus the query itself, ``2w + 1`` keys. ``is_causal`` sets ``right = 0``:
    ``w + 1`` keys, the query and the ``w`` before it. ``window=0`` keeps only the
    diagonal. See the module docstring for how this relates to flash-attn's
    ``window_size`` and Hugging Face's ``sliding_window`` (HF's ``sliding_window=w``
    causal mask is ``window=(w - 1, 0)``).

    Args:
        i: number of queries.
        window: ``w >= 0``, or ``(left, right)`` with each ``>= 0`` or ``None``
            (unbounded).
        j: number of keys (default ``i``). With ``j != i`` the queries are the last
            ``i`` positions (bottom-right alignment): query ``a`` is position
            ``a + j - i``.
        is_causal: also hide keys after the query (needs ``i == j``; otherwise pass
            ``window=(left, 0)``).

    Returns:
        ``(i, j)`` boolean tensor.

    Example:
        >>> sliding_window_mask(4, 1).int().tolist()
        [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
        >>> # two new queries, causal
        >>> sliding_window_mask(2, (1, 0), j=4).int().tolist()
        [[0, 1, 1, 0], [0, 0, 1, 1]]
    """
    i = check_int("i", i, minimum=0)
    j = i if j is None else check_int("j", j, minimum=0)
    device = check_device("device", device)
    left, right = window_bounds(window, i, j)
    left, right = causal_bounds(left, right, check_bool("is_causal", is_causal), i, j)
    _room_for(i, j, device)
    off = _offsets(i, j, device)  # (i, j)
    return (off <= left) & (off >= -right)


def dilated_mask(
    n: int, window: int, dilation: int, *, is_causal: bool = False, device=None
) -> Tensor:
    """Dilated (atrous) sliding window of shape ``(n, n)``; True = may attend.

    Query ``p`` sees the keys ``k = p + s * dilation`` for ``s = -window, ..., window``
    (causal: ``s <= 0``): the same number of keys as a window of ``window``, spread over
    a span ``dilation`` times wider, with gaps of ``dilation - 1`` between them.
    ``dilation = 1`` is :func:`sliding_window_mask`.

    Args:
        n: sequence length.
        window: number of attended neighbours on each side, ``>= 0``.
        dilation: stride between attended keys, ``>= 1``.
        is_causal: also hide the future.

    Returns:
        ``(n, n)`` boolean tensor.

    Example:
        >>> dilated_mask(5, 1, 2)[2].int().tolist()
        [1, 0, 1, 0, 1]
    """
    n = check_int("n", n, minimum=0)
    window = check_size("window", window, minimum=0)
    dilation = check_size("dilation", dilation)
    check_bool("is_causal", is_causal)
    device = check_device("device", device)
    _room_for(n, n, device)
    # Beyond n, neither a larger window nor a larger stride reaches another key.
    dilation = min(dilation, max(n, 1))
    span = min(window * dilation, n)
    off = _offsets(n, n, device)  # (i, j)
    mask = (off.abs() <= span) & (off.remainder(dilation) == 0)
    return mask & (off >= 0) if is_causal else mask


def _global_index(n: int, global_idx, device) -> Tensor:
    """The global positions as a 1-D long tensor on ``device``, checked on the CPU."""
    if isinstance(global_idx, Tensor):
        idx = global_idx.cpu() if global_idx.device.type != "meta" else global_idx
    else:
        try:
            idx = torch.as_tensor(list(global_idx))
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(
                "global_idx must be a 1-D sequence of integer positions, "
                f"got {global_idx!r}"
            ) from err
    if idx.numel() == 0:  # an empty list arrives as float: no global tokens
        idx = idx.long()
    if (
        idx.dim() > 1
        or idx.is_floating_point()
        or idx.is_complex()
        or idx.dtype == torch.bool
    ):
        raise ValueError(
            "global_idx must be a 1-D sequence of integer positions, "
            f"got dtype {idx.dtype} and shape {tuple(idx.shape)}"
        )
    idx = idx.reshape(-1).long()
    if idx.device.type != "meta" and idx.numel() and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(
            f"global_idx must lie in [0, n={n}), got min "
            f"{int(idx.min())} and max {int(idx.max())}"
        )
    return idx.to(device)


def global_tokens_mask(n: int, window, global_idx, *, device=None) -> Tensor:
    """Longformer pattern of shape ``(n, n)``: sliding window plus global tokens; True =
    may attend.

    The positions in ``global_idx`` (e.g. a ``[CLS]`` token) attend to every key *and*
    are attended by every query: their rows and columns are all True. Everything else
    is the sliding window of :func:`sliding_window_mask` {cite}`beltagy2020longformer`.

    Args:
        n: sequence length.
        window: ``w >= 0`` neighbours on each side, or ``(left, right)``.
        global_idx: 1-D integer positions in ``[0, n)`` (may be empty).

    Returns:
        ``(n, n)`` boolean tensor.

    Example:
        >>> global_tokens_mask(4, 0, [0]).int().tolist()
        [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    """
    n = check_int("n", n, minimum=0)  # named here: the window mask would call it i
    mask = sliding_window_mask(n, window, device=device)
    idx = _global_index(n, global_idx, mask.device)
    is_global = torch.zeros(n, dtype=torch.bool, device=mask.device)
    is_global[idx] = True
    return mask | is_global.unsqueeze(-1) | is_global.unsqueeze(0)  # (i, j)


def bigbird_mask(
    n: int,
    window,
    num_global: int,
    num_random: int,
    *,
    block_size: int = 1,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    device=None,
) -> Tensor:
    """BigBird pattern of shape ``(n, n)``: window + global + random keys; True = may
    attend.

    The union of three graphs {cite}`zaheer2020bigbird`, built over blocks of
    ``block_size`` positions (``B``; ``B = 1`` is the element-level pattern): the
    sliding window of blocks ``|r - c| <= window``; the first ``num_global`` blocks as
    global blocks (full rows and columns); and, for every other query block,
    ``num_random`` key blocks drawn uniformly without replacement from the blocks that
    are **neither in its window nor global**, as BigBird does, so each random draw adds
    new keys. A row with fewer such blocks left gets all of them. The block layout is
    expanded with :func:`block_sparse_mask` (the last block may be partial).

    So a query that is not global, with its whole window inside the sequence, keeps
    exactly ``(2 * window + 1 + num_global + num_random) * B`` keys (for an int window).

    Args:
        n: sequence length.
        window: ``w >= 0`` neighbouring blocks on each side, or ``(left, right)``.
        num_global: number of leading global blocks, in ``[0, ceil(n / B)]``.
        num_random: random key blocks per query block, in ``[0, ceil(n / B)]``.
        block_size: ``B >= 1`` positions per block (BigBird uses 64).
        generator: a CPU ``torch.Generator``, the source of the random keys; or pass
            ``seed`` for a fresh seeded one. With neither, the global torch generator is
            used.
        seed: integer seed; not together with ``generator``.

    Returns:
        ``(n, n)`` boolean tensor; the same ``seed`` gives the same mask.

    Example:
        >>> m = bigbird_mask(8, 1, 1, 2, seed=0)
        >>> # global row 0; 3 window + 1 global + 2 random otherwise
        >>> m.sum(dim=-1).tolist()
        [8, 5, 6, 6, 6, 6, 6, 5]
        >>> bigbird_mask(8, 0, 1, 1, block_size=2, seed=0).sum(dim=-1).tolist()
        [8, 8, 6, 6, 6, 6, 6, 6]
    """
    n = check_int("n", n, minimum=0)
    B = check_int("block_size", block_size, minimum=1)
    blocks = -(-n // B)
    num_global = _count_at_most(
        "num_global", num_global, blocks, "ceil(n / block_size)"
    )
    num_random = _count_at_most(
        "num_random", num_random, blocks, "ceil(n / block_size)"
    )
    if generator is not None and seed is not None:
        raise ValueError("pass either generator or seed, not both")
    # the random keys are drawn on the CPU, so a seed means the same mask everywhere
    check_generator(generator, torch.device("cpu"))
    if seed is not None:
        seed = check_int("seed", seed, minimum=-(2**63))
        if seed >= 2**64:
            raise ValueError(
                f"seed must fit in 64 bits, in [-2**63, 2**64), got {seed}"
            )
        generator = torch.Generator().manual_seed(seed)
    device = check_device("device", device)
    layout = global_tokens_mask(
        blocks, window, range(num_global)
    )  # (blocks, blocks), CPU
    if num_random:
        # per row, the num_random candidates with the smallest of independent uniforms:
        # a uniformly random subset of the blocks outside the window and the global
        # blocks
        free = ~layout  # (blocks, blocks): global rows are full, so they have none
        u = torch.rand(blocks, blocks, generator=generator).masked_fill(~free, 2.0)
        picks = u.argsort(dim=-1)[:, :num_random]  # (blocks, num_random)
        rand = torch.zeros(blocks, blocks, dtype=torch.bool)
        rand.scatter_(-1, picks, True)
        layout = layout | (rand & free)
    return block_sparse_mask(layout.to(device), B, n)


def block_sparse_mask(
    layout: Tensor, block_size: int, n: int | tuple[int, int] | None = None
) -> Tensor:
    """Expand a block layout into an element mask; True = may attend.

    Block ``(r, c)`` of the layout covers queries ``r*B ... r*B + B - 1`` and keys
    ``c*B ... c*B + B - 1`` (``B = block_size``); its value fills that tile. The result
    is cropped to ``n`` positions, so the last block may be partial.

    Args:
        layout: ``(ceil(i / B), ceil(j / B))`` boolean, True = the tile is computed.
        block_size: ``B >= 1``.
        n: sequence length (an int, or ``(i, j)`` for rectangular layouts). Default: the
            full ``(rows * B, columns * B)`` of the layout. Each length must need
            exactly the layout's number of blocks: ``ceil(n / B)``.

    Returns:
        ``(i, j)`` boolean tensor on the layout's device.

    Example:
        >>> layout = torch.tensor([[True, False], [True, True]])
        >>> block_sparse_mask(layout, 2, 3).int().tolist()
        [[1, 1, 0], [1, 1, 0], [1, 1, 1]]
    """
    check_layout(layout)
    block_size = check_int("block_size", block_size, minimum=1)
    rows, cols = layout.shape
    if n is None:
        i, j = rows * block_size, cols * block_size
    elif isinstance(n, tuple | list):
        if len(n) != 2:
            raise ValueError(f"n must be an int or a pair (i, j), got {n!r}")
        i, j = check_int("i", n[0], minimum=0), check_int("j", n[1], minimum=0)
    else:
        i = j = check_int("n", n, minimum=0)
    check_layout_fits(layout, block_size, i, j)
    _room_for(i, j, layout.device)
    block_size = min(
        block_size, max(i, j, 1)
    )  # the same blocks: each is the whole length
    query_block = torch.arange(i, device=layout.device) // block_size  # (i,)
    key_block = torch.arange(j, device=layout.device) // block_size  # (j,)
    return layout[query_block[:, None], key_block[None, :]]  # (i, j)


def local_global_layout(
    num_blocks: int,
    window: int,
    num_global: int,
    *,
    is_causal: bool = False,
    device=None,
) -> Tensor:
    """A block layout: a band of ``window`` neighbouring blocks plus ``num_global``
    global blocks.

    Block ``(r, c)`` is kept iff ``|r - c| <= window`` or ``r < num_global`` or
    ``c < num_global`` (the Longformer / BigBird shape at block level), and, with
    ``is_causal``, only if ``c <= r``. Feed it to :func:`block_sparse_mask` and
    :func:`~attention.efficient.sparse.block_sparse_attention`.

    Args:
        num_blocks: blocks per side, ``>= 0``.
        window: neighbouring blocks on each side, ``>= 0``.
        num_global: leading global blocks, in ``[0, num_blocks]``.
        is_causal: keep only the blocks on or below the diagonal.

    Returns:
        ``(num_blocks, num_blocks)`` boolean layout, True = the tile is computed.

    Example:
        >>> local_global_layout(4, 0, 1).int().tolist()
        [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    """
    num_blocks = check_int("num_blocks", num_blocks, minimum=0)
    window = check_size("window", window, minimum=0)
    num_global = _count_at_most("num_global", num_global, num_blocks, "num_blocks")
    check_bool("is_causal", is_causal)
    layout = global_tokens_mask(num_blocks, window, range(num_global), device=device)
    if is_causal:
        layout = layout & tril_mask(*layout.shape[-2:], device=layout.device)
    return layout
