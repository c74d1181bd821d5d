r"""Multi-query associative recall (MQAR), the task that measures what a memory can hold
(chapter 12).

Shape legend: ``b`` batch, ``n`` positions (``seq_len``).

MQAR :cite:`arora2023zoology` asks a sequence model to look values up by key, several
times in one sequence. A sequence opens with ``num_pairs`` key–value pairs
``k_1 v_1 k_2 v_2 ...``; the rest holds each key once more, in a random order at random
positions, among filler tokens ``0``. At each repeated key the model must output the
value that followed that key in the context. Softmax attention solves it with one
induction step; a fixed-size state must hold all the pairs at once, so recall falls as
``num_pairs`` grows past what the state can store.

The layout follows HazyResearch's ``zoology`` design: keys are drawn from the first half
of the vocabulary, values from the second half, both without replacement within a
sequence; token ``0`` is the filler (never a key or value); only the positions of the
repeated keys are scored, with the value as target (the next-token prediction of the
full sequence), every other target is ``-100``, PyTorch's ``ignore_index``. One
difference: the query positions are drawn uniformly from the free positions (zoology
draws the gaps from a power law).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_generator, check_size

__all__ = ["mqar_batch"]

IGNORE_INDEX = -100


def mqar_batch(
    num_pairs: int,
    seq_len: int,
    vocab_size: int,
    *,
    batch_size: int = 1,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""A batch of multi-query associative recall sequences.

    Positions ``0 .. 2 num_pairs - 1`` hold the pairs (key at even, value at odd
    positions); each key appears once more at a distinct random position
    ``>= 2 num_pairs``, where the target is its value.

    Args:
        num_pairs: key–value pairs per sequence (``>= 1``), also the number of queries.
        seq_len: positions per sequence; at least ``3 num_pairs`` (pairs, then one slot
            per query).
        vocab_size: tokens ``0 .. vocab_size - 1``; keys come from
            ``1 .. vocab_size // 2 - 1`` and values from
            ``vocab_size // 2 .. vocab_size - 1``, so
            ``vocab_size // 2 - 1 >= num_pairs`` is required.
        batch_size: sequences ``b``.
        generator: a ``torch.Generator`` for reproducible batches (``None``: the global
            one).

    Returns:
        ``(inputs, targets, scored)``: ``inputs`` ``(b, n)`` int64 tokens, ``targets``
        ``(b, n)`` int64 (the value at scored positions, ``-100`` elsewhere), ``scored``
        ``(b, n)`` bool, True at the ``num_pairs`` query positions of each sequence.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> inputs, targets, scored = mqar_batch(2, 8, 10, generator=g)
        >>> inputs.shape, int(scored.sum())
        (torch.Size([1, 8]), 2)
        >>> # a repeated key; its target is the value after it in the context
        >>> key = inputs[scored][0]
        >>> pos = (inputs[0, :4] == key).nonzero()[0, 0]
        >>> bool(targets[scored][0] == inputs[0, pos + 1])
        True
    """
    num_pairs = check_size("num_pairs", num_pairs)
    seq_len = check_size("seq_len", seq_len)
    vocab_size = check_size("vocab_size", vocab_size)
    batch_size = check_size("batch_size", batch_size)
    generator = check_generator(generator)
    if seq_len < 3 * num_pairs:
        raise ValueError(
            f"seq_len must be >= 3 * num_pairs = {3 * num_pairs} "
            f"(the pairs, then a slot per query), got {seq_len}"
        )
    half = vocab_size // 2
    if half - 1 < num_pairs:
        raise ValueError(
            "vocab_size // 2 - 1 keys (tokens 1 .. vocab_size // 2 - 1) must be >= "
            f"num_pairs = {num_pairs} distinct keys, got vocab_size = {vocab_size}"
        )

    def draw(count: int, size: int) -> Tensor:
        """``size`` distinct integers from ``0 .. count - 1``, per row: (b, size)."""
        return torch.rand(batch_size, count, generator=generator).argsort(dim=-1)[
            :, :size
        ]

    keys = 1 + draw(half - 1, num_pairs)  # (b, p)
    values = half + draw(vocab_size - half, num_pairs)  # (b, p)
    inputs = torch.zeros(batch_size, seq_len, dtype=torch.long)
    targets = torch.full((batch_size, seq_len), IGNORE_INDEX, dtype=torch.long)
    inputs[:, 0 : 2 * num_pairs : 2] = keys
    inputs[:, 1 : 2 * num_pairs : 2] = values
    # Each key once more, in a random order, at distinct random free positions.
    slots = 2 * num_pairs + draw(seq_len - 2 * num_pairs, num_pairs)  # (b, p)
    order = draw(num_pairs, num_pairs)  # (b, p): which pair each slot asks for
    inputs.scatter_(1, slots, keys.gather(1, order))
    targets.scatter_(1, slots, values.gather(1, order))
    return inputs, targets, targets != IGNORE_INDEX
