"""Checkers for chapter 4's exercises: causal, padding, decoding masks, masked weights.

Each checker takes your function, runs it beside the course's own on a few inputs (the
traps included) and prints one line starting with ``✓``, or raises an
:class:`~attention.exercises.ExerciseError` that says in one line what is wrong::

    from attention.exercises import ch04
    ch04.check_causal_mask(my_causal_mask)

Mask convention: boolean, **True = may attend**, as in
``torch.nn.functional.scaled_dot_product_attention``. Shape legend: ``B`` sequences,
``L`` positions, ``n`` new queries, ``c`` cached positions.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..foundations.masks import causal_mask, decoding_mask, padding_mask
from ._checker import Case, Mistake, Property, check, randn, random_mask

__all__ = [
    "check_causal_mask",
    "check_padding_mask",
    "check_decoding_mask",
    "check_masked_weights",
]

_INVERTED = "the mask looks inverted: True must mean may attend"

# ----------------------------------------------------------------------- causal mask


def _upper(length):
    return torch.ones(length, length, dtype=torch.bool).triu()


def _strict(length):
    return torch.ones(length, length, dtype=torch.bool).tril(-1)


def _future_only(length):
    return torch.ones(length, length, dtype=torch.bool).triu(1)


def check_causal_mask(fn) -> None:
    """Check ``fn(length)``: the ``(length, length)`` causal mask, True = may attend.

    Query ``i`` may attend to key ``j`` when ``j <= i``: True on and below the
    diagonal, False above it. The result is a bool tensor. The inputs: 4, 1 and 6
    positions. Known mistakes are named: the polarity inverted (True on the future),
    the diagonal blocked (an off-by-one ``j < i``: a query must see itself), the upper
    triangle instead of the lower. A float or int mask is refused with a hint.

    Example:
        >>> def my_causal_mask(length):
        ...     i = torch.arange(length)
        ...     return i[None, :] <= i[:, None]
        >>> check_causal_mask(my_causal_mask)
        ✓ my_causal_mask: True where key j <= query i (3 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        causal_mask,
        [
            Case("4 positions", (4,)),
            Case("1 position", (1,)),
            Case("6 positions", (6,)),
        ],
        what="True where key j <= query i",
        mistakes=[
            Mistake(
                f"{_INVERTED}; True on and below the diagonal, False on the future",
                _future_only,
            ),
            Mistake(
                "the diagonal is blocked (off by one): query i may attend to itself, "
                "key j <= i, not j < i",
                _strict,
            ),
            Mistake(
                "this is the upper triangle: query i (a row) may see keys 0..i, on "
                "and below the diagonal",
                _upper,
            ),
        ],
    )


# ---------------------------------------------------------------------- padding mask


def _pad_inverted(lengths, max_len):
    return ~padding_mask(lengths, max_len)


def _pad_off_by_one(lengths, max_len):
    return (torch.arange(max_len) <= lengths[:, None])[:, None, None, :]


def _pad_two_dims(lengths, max_len):
    return torch.arange(max_len) < lengths[:, None]


def _pad_queries(lengths, max_len):
    return (torch.arange(max_len) < lengths[:, None])[:, None, :, None]


def _padding_cases() -> list[Case]:
    long: dict[str, Any] = dict(dtype=torch.long)
    return [
        Case("lengths [5, 3, 2], padded to 5", (torch.tensor([5, 3, 2], **long), 5)),
        Case("one sequence of 4, padded to 6", (torch.tensor([4], **long), 6)),
        Case("lengths [1, 3], padded to 3", (torch.tensor([1, 3], **long), 3)),
    ]


def check_padding_mask(fn) -> None:
    """Check ``fn(lengths, max_len)``: the key-padding mask, ``(B, 1, 1, max_len)``.

    ``lengths`` is a ``(B,)`` integer tensor: sequence ``b`` holds ``lengths[b]`` real
    tokens at positions ``0 .. lengths[b] - 1``, then padding up to ``max_len``. The
    mask is True on the real tokens (they may be attended) and False on the padding.
    The two singleton axes stand for the heads and the queries, so that the mask
    broadcasts against ``(B, H, L_q, L_k)`` scores. Known mistakes are named: the
    polarity inverted, an off-by-one (``<=``), a ``(B, L)`` mask without the singleton
    axes, and the positions on the query axis instead of the key axis.

    Example:
        >>> def my_padding_mask(lengths, max_len):
        ...     keep = torch.arange(max_len) < lengths[:, None]  # (B, L)
        ...     return keep[:, None, None, :]
        >>> check_padding_mask(my_padding_mask)
        ✓ my_padding_mask: True on real tokens, (B, 1, 1, L) (3 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        padding_mask,
        _padding_cases(),
        what="True on real tokens, (B, 1, 1, L)",
        mistakes=[
            Mistake(f"{_INVERTED}; True on the real tokens", _pad_inverted),
            Mistake(
                "off by one: positions 0 .. length - 1 are real, so compare with <",
                _pad_off_by_one,
            ),
            Mistake(
                "add the axes of heads and queries: mask[:, None, None, :] is "
                "(B, 1, 1, L)",
                _pad_two_dims,
            ),
            Mistake(
                "the positions are on the query axis: a padding mask hides keys, the "
                "last axis",
                _pad_queries,
            ),
        ],
    )


# --------------------------------------------------------------------- decoding mask


def _top_left(num_new, num_cached):
    return causal_mask(num_new, num_cached + num_new)


def _new_block_only(num_new, num_cached):
    return causal_mask(num_new)


def _cache_blocked(num_new, num_cached):
    blocked = torch.zeros(num_new, num_cached, dtype=torch.bool)
    return torch.cat([blocked, causal_mask(num_new)], dim=-1)


def _decoding_cases() -> list[Case]:
    return [
        Case("3 new tokens after 5 cached", (3, 5)),
        Case("1 new token after 4 cached", (1, 4)),
        Case("4 new tokens, nothing cached", (4, 0)),
        Case("2 new tokens after 2 cached", (2, 2)),
    ]


def check_decoding_mask(fn) -> None:
    """Check ``fn(num_new, num_cached)``: the mask of new queries against a KV cache.

    ``num_cached`` positions are in the cache; ``num_new`` queries arrive at absolute
    positions ``num_cached ..``. The keys are the cached ones followed by the new ones,
    so the mask is ``(num_new, num_cached + num_new)``. New query ``r`` may see every
    cached key and new keys ``0 .. r``: a block of True, then a causal triangle. It is
    the last ``num_new`` rows of the causal mask over all positions. The inputs: 3 new
    after 5 cached, one new token (all True), nothing cached (the plain causal mask),
    and 2 after 2.

    Known mistakes are named: the triangle aligned top-left (what ``is_causal=True``
    does), the cached keys left out or blocked, and the polarity inverted.

    Example:
        >>> def my_decoding_mask(num_new, num_cached):
        ...     total = num_cached + num_new
        ...     return torch.ones(total, total, dtype=torch.bool).tril()[num_cached:]
        >>> check_decoding_mask(my_decoding_mask)  # doctest: +ELLIPSIS
        ✓ my_decoding_mask: ... (4 inputs, exactly)
    """
    __tracebackhide__ = True
    check(
        fn,
        decoding_mask,
        _decoding_cases(),
        what="cached keys plus a causal triangle",
        mistakes=[
            Mistake(
                "the triangle is aligned top-left, as is_causal=True does: new query "
                "r sits at position num_cached + r and sees every cached key",
                _top_left,
            ),
            Mistake(
                "the cached keys are missing: the keys are the num_cached cached ones "
                "followed by the num_new new ones",
                _new_block_only,
            ),
            Mistake(
                "the cached keys are blocked: every new query may see all of them",
                _cache_blocked,
            ),
            Mistake(
                f"{_INVERTED}; True on the cache and on new keys up to the query",
                lambda num_new, num_cached: ~decoding_mask(num_new, num_cached),
            ),
        ],
    )


# -------------------------------------------------------------------- masked weights


def _masked_weights(scores: Tensor, mask: Tensor) -> Tensor:
    """The reference: softmax of the scores with -inf where the mask is False, and
    zeros for a row that has no True (nothing to attend to)."""
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights.nan_to_num(0.0)


def _finite_fill(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)


def _inverted_weights(scores, mask):
    return _masked_weights(scores, ~mask)


def _after_softmax(scores, mask):
    return torch.softmax(scores, dim=-1) * mask


def _masked_cases() -> list[Case]:
    dead = random_mask(4, 5, seed=82)
    dead[2] = False  # a query with nothing to attend to
    nan = (
        "the row whose mask is all False has nothing to attend to: softmax of all "
        "-inf is 0/0; give that row weights of 0"
    )
    return [
        Case(
            "3 rows of 5 scores, a random mask",
            (randn(3, 5, seed=80), random_mask(3, 5, seed=81)),
        ),
        Case(
            "a batch (2, 3, 4) with a causal mask (3, 4) that broadcasts",
            (randn(2, 3, 4, seed=83), causal_mask(3, 4)),
        ),
        Case("row 2 entirely masked", (randn(4, 5, seed=84), dead), hint=nan),
    ]


def check_masked_weights(fn) -> None:
    """Check ``fn(scores, mask)``: softmax weights that give masked keys weight 0.

    ``scores`` is ``(..., i, j)``; ``mask`` is boolean, **True = may attend**, and
    broadcasts against ``scores``. Blocked keys must get weight exactly 0, the others
    the softmax over the allowed keys only. A row whose mask is all False has nothing
    to attend to: it must get weights of 0 (no NaN), the course's convention (chapter
    4). The inputs: a random mask, a broadcast causal mask, and a fully masked row.

    Known mistakes are named: the polarity inverted, a finite fill such as ``-1e9``
    (the fully masked row then spreads its weight uniformly over the keys it must not
    see), and a mask applied after the softmax (the rows no longer sum to 1).
    Tolerance: 1e-10 (float64).

    Example:
        >>> def my_masked_weights(scores, mask):
        ...     filled = scores.masked_fill(~mask, float("-inf"))
        ...     return torch.softmax(filled, dim=-1).nan_to_num(0.0)
        >>> check_masked_weights(my_masked_weights)  # doctest: +ELLIPSIS
        ✓ my_masked_weights: ... (3 inputs, within 1e-10)
    """
    __tracebackhide__ = True
    check(
        fn,
        _masked_weights,
        _masked_cases(),
        what="softmax over the allowed keys, 0 elsewhere",
        properties=[
            Property(
                "a blocked key (mask False) must get weight exactly 0",
                lambda out, scores, mask: (out == 0) | mask,
            ),
        ],
        mistakes=[
            Mistake(
                f"{_INVERTED}; fill the scores where it is False", _inverted_weights
            ),
            Mistake(
                "a finite fill leaks: the fully masked row spreads its weight over "
                "keys it must not see; fill with -inf and give that row zeros",
                _finite_fill,
            ),
            Mistake(
                "the mask is applied after the softmax: the weights no longer sum to "
                "1; fill the scores with -inf before it",
                _after_softmax,
            ),
        ],
    )
