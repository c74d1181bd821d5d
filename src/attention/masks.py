"""Mask builders (taught in chapter 04; sparse patterns in chapter 11).

Convention, everywhere in this package: a mask is **boolean and True means "may attend"**,
as in ``torch.nn.functional.scaled_dot_product_attention``. It must broadcast to the
``(b, h, i, j)`` scores: ``i`` indexes queries (rows), ``j`` keys (columns).
``nn.MultiheadAttention``'s ``attn_mask``/``key_padding_mask`` use the opposite polarity
(True = blocked); invert with ``~mask`` when passing one of ours there.

Shape legend: ``b`` batch, ``h`` heads, ``i`` query positions, ``j`` key positions, ``n``
sequence length when ``i = j``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from ._checks import (
    broadcast_shapes,
    check_bool,
    check_choice,
    check_device,
    check_dtype,
    check_has_data,
    check_int,
    check_same_device,
    check_tensor,
)

__all__ = ["causal_mask", "padding_mask", "block_diagonal_mask", "combine_masks"]


def causal_mask(
    i: int, j: int | None = None, *, align: str = "top-left", device=None
) -> Tensor:
    """Causal (look-ahead) mask of shape ``(i, j)``; True = may attend.

    With ``align="top-left"`` (what ``is_causal=True`` means in PyTorch) query ``q`` may
    see key ``k`` iff ``k <= q``. With ``align="bottom-right"`` the last query is aligned
    with the last key, ``k <= q + (j - i)``: the right mask when ``i`` new queries follow
    ``j - i`` cached positions during incremental decoding (flash-attn's ``causal=True``
    aligns this way).

    Args:
        i: number of queries.
        j: number of keys (defaults to ``i``).
        align: ``"top-left"`` or ``"bottom-right"``.
        device: where to build the mask.

    Returns:
        ``(i, j)`` boolean tensor.

    Example:
        >>> causal_mask(2, 3).int().tolist()
        [[1, 0, 0], [1, 1, 0]]
        >>> causal_mask(2, 3, align="bottom-right").int().tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    i = check_int("i", i, minimum=0)
    j = i if j is None else check_int("j", j, minimum=0)
    check_choice("align", align, ("top-left", "bottom-right"))
    device = check_device("device", device)
    offset = 0 if align == "top-left" else j - i
    q = torch.arange(i, device=device).unsqueeze(-1)  # (i, 1)
    k = torch.arange(j, device=device).unsqueeze(0)  # (1, j)
    return k <= q + offset  # (i, j)


def decoding_mask(num_new: int, num_cached: int, *, device=None) -> Tensor:
    """Mask for ``num_new`` queries appended after ``num_cached`` cached positions.

    Every new query sees all cached keys plus a causal triangle over the new ones:
    ``(num_new, num_cached + num_new)``, True = may attend. The same as
    ``causal_mask(num_new, num_cached + num_new, align="bottom-right")``, which the
    package uses; this name stays for chapter 04, which builds it step by step.

    Example:
        >>> decoding_mask(2, 1).int().tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    num_new = check_int("num_new", num_new, minimum=0)
    num_cached = check_int("num_cached", num_cached, minimum=0)
    return causal_mask(num_new, num_cached + num_new, align="bottom-right", device=device)


def _lengths(lengths, device) -> Tensor:
    """``lengths`` as a 1-D LongTensor of non-negative integers (floats are refused)."""
    device = check_device("device", device)
    if isinstance(lengths, Tensor):
        if lengths.is_floating_point() or lengths.is_complex() or lengths.dtype == torch.bool:
            raise TypeError(f"lengths must be an integer tensor, got dtype {lengths.dtype}")
        if lengths.dim() != 1:
            raise ValueError(f"lengths must be 1-D, one length per sequence, got shape {tuple(lengths.shape)}")
        lengths = lengths.to(device=device if device is not None else lengths.device,
                             dtype=torch.long)
    else:
        try:
            if isinstance(lengths, (str, bytes)):
                raise TypeError
            lengths = list(lengths)  # a list, tuple, range or NumPy array of ints
        except TypeError:
            raise TypeError(
                f"lengths must be a sequence of ints or a 1-D integer tensor, "
                f"got {type(lengths).__name__}"
            ) from None
        for n in lengths:
            if isinstance(n, bool) or not isinstance(n, numbers.Integral):
                raise TypeError(f"lengths must hold ints, got {type(n).__name__} {n!r}")
        lengths = torch.tensor([int(n) for n in lengths], dtype=torch.long, device=device)
    check_has_data("lengths", lengths)
    if lengths.numel() and lengths.min() < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    return lengths


def padding_mask(
    lengths: Tensor | Sequence[int], j: int, *, side: str = "right", device=None
) -> Tensor:
    """Key-padding mask of shape ``(b, 1, 1, j)``; True = a real token that may be attended.

    Sequence ``n`` of the batch holds ``lengths[n]`` real tokens. With ``side="right"``
    the padding follows them (real tokens at positions ``0 ... lengths[n] - 1``); with
    ``side="left"`` it precedes them (real tokens at ``j - lengths[n] ... j - 1``), the
    layout decoder-only models use for batched generation, so that every sequence ends
    at the last position. The two singleton axes broadcast over heads and queries.

    Args:
        lengths: ``(b,)`` integers in ``[0, j]`` (a list of ints or an integer tensor;
            floats are refused rather than truncated).
        j: padded key length.
        side: ``"right"`` or ``"left"``, where the padding sits.
        device: where to build the mask (default: that of ``lengths``).

    Returns:
        ``(b, 1, 1, j)`` boolean tensor.

    Example:
        >>> padding_mask([2, 3], 3)[:, 0, 0].int().tolist()
        [[1, 1, 0], [1, 1, 1]]
        >>> padding_mask([2, 3], 3, side="left")[:, 0, 0].int().tolist()
        [[0, 1, 1], [1, 1, 1]]
    """
    j = check_int("j", j, minimum=0)
    check_choice("side", side, ("right", "left"))
    lengths = _lengths(lengths, device)
    if lengths.numel() and lengths.max() > j:
        raise ValueError(f"lengths must lie in [0, j={j}], got {lengths.tolist()}")
    positions = torch.arange(j, device=lengths.device)  # (j,)
    if side == "left":
        keep = positions >= j - lengths.unsqueeze(-1)  # (b, j)
    else:
        keep = positions < lengths.unsqueeze(-1)  # (b, j)
    return keep[:, None, None, :]  # (b, 1, 1, j)


def block_diagonal_mask(
    lengths: Tensor | Sequence[int], *, is_causal: bool = False, device=None
) -> Tensor:
    """Mask for packed sequences ("document masking"), shape ``(n, n)`` with ``n = sum(lengths)``.

    Several sequences of unequal length are concatenated into one row of ``n`` tokens
    instead of being padded to a common length; a token may attend only to the tokens
    of its own sequence, so the mask is block-diagonal, one ``(l, l)`` block of True per
    sequence. With ``is_causal`` each block is also lower-triangular (packed training of a
    decoder). Attention under this mask equals attention run on each sequence apart;
    what the packing saves is the padding. (flash-attn's ``flash_attn_varlen_func`` with
    ``cu_seqlens`` and xFormers' ``BlockDiagonalMask.from_seqlens`` express the same.)

    Args:
        lengths: the lengths of the packed sequences, integers ``>= 0``.
        is_causal: also hide keys after the query inside each sequence.
        device: where to build the mask (default: that of ``lengths``).

    Returns:
        ``(n, n)`` boolean tensor, True = may attend.

    Example:
        >>> block_diagonal_mask([2, 1]).int().tolist()
        [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    """
    check_bool("is_causal", is_causal)
    lengths = _lengths(lengths, device)
    segment = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=lengths.device), lengths
    )  # (n,): which sequence each packed token belongs to
    mask = segment.unsqueeze(-1) == segment.unsqueeze(0)  # (n, n)
    return mask.tril() if is_causal else mask


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of boolean masks after broadcasting; ``None`` entries are skipped.

    A position may be attended only if every mask allows it. Returns ``None`` when all
    inputs are ``None`` (no masking).

    Example:
        >>> m = combine_masks(causal_mask(3), padding_mask([2], 3))
        >>> m.shape, m[0, 0].int().tolist()
        (torch.Size([1, 1, 3, 3]), [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    """
    present = [m for m in masks if m is not None]
    for n, m in enumerate(present):
        check_tensor(f"mask {n}", m)
        if m.dtype != torch.bool:
            raise TypeError(f"combine_masks takes boolean masks (True = may attend), got {m.dtype}")
    if not present:
        return None
    check_same_device(**{f"mask {n}": m for n, m in enumerate(present)})
    broadcast_shapes("masks", *(tuple(m.shape) for m in present))
    out = present[0]
    for m in present[1:]:
        out = out & m
    return out


def to_additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Turn a boolean mask (True = may attend) into an additive one: 0 where allowed, -inf where not.

    Adding the result to the scores before the softmax is equivalent to masking, and
    ``exp(-inf) = 0`` exactly. (A finite stand-in such as -1e9 leaks a tiny weight and
    overflows in float16; chapter 04 shows both.)

    Example:
        >>> to_additive_mask(torch.tensor([True, False])).tolist()
        [0.0, -inf]
    """
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
    check_dtype("dtype", dtype, floating=True)
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))


# ----------------------------------------------------------------------------------------
# Sparse patterns (chapter 11). Each builder returns an ``(n, n)`` boolean mask, True = may
# attend, that the efficient kernels in ``attention/sparse.py`` are tested against.
# ----------------------------------------------------------------------------------------

__all__ += [
    "sliding_window_mask",
    "dilated_mask",
    "global_tokens_mask",
    "bigbird_mask",
    "block_sparse_mask",
]


def _offsets(n: int, device) -> Tensor:
    """``(n, n)`` matrix of ``i - j`` (query position minus key position)."""
    pos = torch.arange(n, device=device)
    return pos.unsqueeze(-1) - pos.unsqueeze(0)  # (i, j)


def sliding_window_mask(n: int, window: int, *, is_causal: bool = False, device=None) -> Tensor:
    """Local (sliding-window) mask of shape ``(n, n)``; True = may attend.

    Query ``i`` may see key ``j`` iff ``|i - j| <= window`` and, with ``is_causal``,
    ``j <= i``. ``window = 0`` keeps only the diagonal; each row has at most
    ``2 * window + 1`` (causal: ``window + 1``) True entries.

    Args:
        n: sequence length (queries = keys).
        window: how many neighbours on each side, ``>= 0``.
        is_causal: also hide the future.

    Returns:
        ``(n, n)`` boolean tensor.

    Example:
        >>> sliding_window_mask(4, 1).int().tolist()
        [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1], [0, 0, 1, 1]]
    """
    n = check_int("n", n, minimum=0)
    window = check_int("window", window, minimum=0)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    off = _offsets(n, device)  # (i, j)
    mask = off.abs() <= window
    return mask & (off >= 0) if is_causal else mask


def dilated_mask(
    n: int, window: int, dilation: int, *, is_causal: bool = False, device=None
) -> Tensor:
    """Dilated (atrous) sliding window of shape ``(n, n)``; True = may attend.

    Query ``i`` sees the keys ``j = i + k * dilation`` for ``k = -window, ..., window``
    (causal: ``k <= 0``): the same number of keys as a window of ``window``, spread over
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
    window = check_int("window", window, minimum=0)
    dilation = check_int("dilation", dilation, minimum=1)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    off = _offsets(n, device)  # (i, j)
    mask = (off.abs() <= window * dilation) & (off.remainder(dilation) == 0)
    return mask & (off >= 0) if is_causal else mask


def _global_index(n: int, global_idx, device) -> Tensor:
    idx = torch.as_tensor(global_idx, device=device)
    if idx.numel() == 0:  # an empty list arrives as float: no global tokens
        idx = idx.long()
    if idx.dim() > 1 or idx.is_floating_point() or idx.dtype == torch.bool:
        raise ValueError(
            f"global_idx must be a 1-D sequence of integer positions, got dtype {idx.dtype} "
            f"and shape {tuple(idx.shape)}"
        )
    idx = idx.reshape(-1).long()
    if idx.numel() and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(
            f"global_idx must lie in [0, n={n}), got min {int(idx.min())} and max {int(idx.max())}"
        )
    return idx


def global_tokens_mask(n: int, window: int, global_idx, *, device=None) -> Tensor:
    """Longformer pattern of shape ``(n, n)``: sliding window plus global tokens; True = may attend.

    The positions in ``global_idx`` (e.g. a ``[CLS]`` token) attend to every key *and*
    are attended by every query: their rows and columns are all True. Everything else
    is the sliding window ``|i - j| <= window`` {cite}`beltagy2020longformer`.

    Args:
        n: sequence length.
        window: neighbours on each side, ``>= 0``.
        global_idx: 1-D integer positions in ``[0, n)`` (may be empty).

    Returns:
        ``(n, n)`` boolean tensor.

    Example:
        >>> global_tokens_mask(4, 0, [0]).int().tolist()
        [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]]
    """
    mask = sliding_window_mask(n, window, device=device)
    idx = _global_index(n, global_idx, device)
    is_global = torch.zeros(n, dtype=torch.bool, device=device)
    is_global[idx] = True
    return mask | is_global.unsqueeze(-1) | is_global.unsqueeze(0)  # (i, j)


def bigbird_mask(
    n: int,
    window: int,
    num_global: int,
    num_random: int,
    *,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    device=None,
) -> Tensor:
    """BigBird pattern of shape ``(n, n)``: window + global + random keys; True = may attend.

    The union of three graphs {cite}`zaheer2020bigbird`: the sliding window
    ``|i - j| <= window``; the first ``num_global`` positions as global tokens (full rows
    and columns); and, for every query, ``num_random`` keys drawn uniformly without
    replacement from all ``n`` positions. (The paper draws random *blocks*; this is the
    element-level version. Apply :func:`block_sparse_mask` to a block layout for that.)

    Args:
        n: sequence length.
        window: neighbours on each side, ``>= 0``.
        num_global: number of leading global tokens, in ``[0, n]``.
        num_random: random keys per query, in ``[0, n]``.
        generator: source of the random keys; or pass ``seed`` for a fresh seeded one.
            With neither, the global torch generator is used.
        seed: integer seed; not together with ``generator``.

    Returns:
        ``(n, n)`` boolean tensor; the same ``seed`` gives the same mask.
    """
    n = check_int("n", n, minimum=0)
    window = check_int("window", window, minimum=0)
    num_global = check_int("num_global", num_global, minimum=0)
    num_random = check_int("num_random", num_random, minimum=0)
    if num_global > n:
        raise ValueError(f"num_global must be <= n={n}, got {num_global}")
    if num_random > n:
        raise ValueError(f"num_random must be <= n={n}, got {num_random}")
    if generator is not None and seed is not None:
        raise ValueError("pass either generator or seed, not both")
    if seed is not None:
        generator = torch.Generator().manual_seed(check_int("seed", seed))
    mask = global_tokens_mask(n, window, range(num_global), device=device)
    if num_random:
        # a uniformly random subset per row: the indices of the num_random smallest of
        # n independent uniforms (drawn on the CPU so a seed means the same everywhere)
        picks = torch.rand(n, n, generator=generator).argsort(dim=-1)[:, :num_random]
        rand = torch.zeros(n, n, dtype=torch.bool)
        rand.scatter_(-1, picks, True)
        mask = mask | rand.to(mask.device)
    return mask


def block_sparse_mask(
    layout: Tensor, block_size: int, n: int | tuple[int, int] | None = None
) -> Tensor:
    """Expand a block layout into an element mask; True = may attend.

    Block ``(r, c)`` of the layout covers queries ``r*B ... r*B + B - 1`` and keys
    ``c*B ... c*B + B - 1`` (``B = block_size``); its value fills that tile. The result
    is cropped to ``n`` positions, so the last block may be partial.

    Args:
        layout: ``(n_query_blocks, n_key_blocks)`` boolean, True = the tile is computed.
        block_size: ``B >= 1``.
        n: sequence length (an int, or ``(i, j)`` for rectangular layouts). Default: the
            full ``(n_query_blocks * B, n_key_blocks * B)``. Each length must need exactly
            the layout's number of blocks: ``ceil(n / B)``.

    Returns:
        ``(i, j)`` boolean tensor.

    Example:
        >>> block_sparse_mask(torch.tensor([[True, False], [True, True]]), 2, 3).int().tolist()
        [[1, 1, 0], [1, 1, 0], [1, 1, 1]]
    """
    check_tensor("layout", layout)
    if layout.dtype != torch.bool:
        raise TypeError(f"layout must be boolean (True = block computed), got {layout.dtype}")
    if layout.dim() != 2:
        raise ValueError(
            f"layout must be a 2-D (query blocks, key blocks) matrix, got shape {tuple(layout.shape)}"
        )
    block_size = check_int("block_size", block_size, minimum=1)
    nbq, nbk = layout.shape
    if n is None:
        i, j = nbq * block_size, nbk * block_size
    else:
        i, j = (n, n) if not isinstance(n, tuple) else n
        i = check_int("n", i, minimum=0)
        j = check_int("n", j, minimum=0)
    for name, length, blocks in (("query", i, nbq), ("key", j, nbk)):
        if -(-length // block_size) != blocks:
            raise ValueError(
                f"layout has {blocks} {name} blocks but {length} {name} positions with "
                f"block_size {block_size} need ceil({length}/{block_size}) = "
                f"{-(-length // block_size)}"
            )
    mask = layout.repeat_interleave(block_size, dim=0).repeat_interleave(block_size, dim=1)
    return mask[:i, :j]  # (i, j)
