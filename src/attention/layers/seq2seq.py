"""A tiny encoder-decoder whose cross-attention learns an alignment (chapter 8).

The first toy task is sequence reversal: the source ``3 1 4 1 5`` must become
``5 1 4 1 3``. Output position ``t`` of a length-``n`` sequence needs exactly source
position ``n - 1 - t``, so a trained cross-attention should put its weight on the
anti-diagonal: position alone solves it. The second, key-value lookup
(:func:`lookup_batch`), needs content: the source position to read depends on where a
key landed.

Shape legend: ``b`` batch, ``i`` target (decoder) positions, ``j`` source (encoder)
positions, ``d`` model size, ``V`` vocabulary size.

Mask convention: boolean, **True = may attend**, broadcastable to the single-head
``(b, i, j)`` scores. :func:`encoder_decoder_masks` builds the three masks of an
encoder-decoder: encoder self-attention (source padding), decoder self-attention
(causal and target padding) and cross-attention (source padding).

Tokens: ``PAD = 0``, ``BOS = 1`` (start of the decoder input), symbols from
``FIRST_SYMBOL = 2`` on.

This module is the toolkit of one chapter, not part of the attention library, so the
package's facade does not re-export it: import it as
``from attention.layers.seq2seq import TinySeq2Seq, train_seq2seq``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .._checks import (
    check_bool,
    check_generator,
    check_has_data,
    check_int,
    check_real,
    check_same_device,
    check_tensor,
)
from ..foundations.masks import causal_mask, combine_masks, padding_mask
from .cross_attention import CrossAttention
from .self_attention import SelfAttention

__all__ = [
    "PAD",
    "BOS",
    "FIRST_SYMBOL",
    "ReversalBatch",
    "reversal_batch",
    "lookup_batch",
    "encoder_decoder_masks",
    "TinySeq2Seq",
    "train_seq2seq",
    "greedy_decode",
]

PAD, BOS, FIRST_SYMBOL = 0, 1, 2


class ReversalBatch(NamedTuple):
    """One batch of the reversal task; every field is a ``(b, n)`` LongTensor.

    ``src`` is the source, ``tgt_out`` the reversed source (what the decoder must
    predict) and ``tgt_in`` the decoder input for teacher forcing: ``BOS`` followed by
    ``tgt_out`` shifted right by one.
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor


def reversal_batch(
    batch_size: int,
    length: int,
    num_symbols: int,
    *,
    generator: torch.Generator | None = None,
) -> ReversalBatch:
    """Random source sequences and their reversals.

    Args:
        batch_size: number of sequences ``b``.
        length: tokens per sequence ``n``.
        num_symbols: the symbols are ``FIRST_SYMBOL ... FIRST_SYMBOL + num_symbols - 1``
            (so the vocabulary has ``num_symbols + 2`` entries, with ``PAD`` and
            ``BOS``).
        generator: a seeded ``torch.Generator`` for reproducible batches.

    Returns:
        :class:`ReversalBatch` of three ``(b, n)`` LongTensors.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> batch = reversal_batch(1, 4, 5, generator=g)
        >>> bool((batch.tgt_out == batch.src.flip(-1)).all())
        True
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    length = check_int("length", length, minimum=1)
    num_symbols = check_int("num_symbols", num_symbols, minimum=1)
    check_generator(generator, torch.device("cpu"))
    src = torch.randint(
        FIRST_SYMBOL,
        FIRST_SYMBOL + num_symbols,
        (batch_size, length),
        generator=generator,
    )  # (b, n)
    tgt_out = src.flip(-1)  # (b, n)
    bos = torch.full((batch_size, 1), BOS, dtype=src.dtype)
    tgt_in = torch.cat([bos, tgt_out[:, :-1]], dim=-1)  # (b, n)
    return ReversalBatch(src, tgt_in, tgt_out)


def lookup_batch(
    batch_size: int,
    num_pairs: int,
    num_values: int,
    *,
    generator: torch.Generator | None = None,
) -> ReversalBatch:
    """The key-value lookup task: output the values in the order of their keys.

    The source is ``num_pairs`` (key, value) pairs in a random order, ``k v k v ...``;
    the keys are a permutation of the ``num_pairs`` key symbols, the values random.
    Output position ``t`` must be the value paired with key ``t``. Where that value sits
    depends on the content (where key ``t`` landed), not on ``t`` alone: unlike
    reversal, no fixed alignment solves it. Returned in the same three fields as
    :func:`reversal_batch`.

    Token ids: keys ``FIRST_SYMBOL ... FIRST_SYMBOL + num_pairs - 1``, values the next
    ``num_values`` ids, so the vocabulary has ``2 + num_pairs + num_values`` entries.

    Args:
        batch_size: number of examples ``b``.
        num_pairs: pairs per example ``P`` (source length ``2P``, target length ``P``).
        num_values: number of value symbols.
        generator: a seeded ``torch.Generator`` for reproducible batches.

    Returns:
        :class:`ReversalBatch` with ``src`` ``(b, 2P)`` and ``tgt_in``, ``tgt_out``
        ``(b, P)``.

    Example:
        >>> batch = lookup_batch(1, 3, 4, generator=torch.Generator().manual_seed(0))
        >>> src, out = batch.src[0].tolist(), batch.tgt_out[0].tolist()
        >>> # the value after key t
        >>> [src[src.index(2 + t) + 1] for t in range(3)] == out
        True
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    num_pairs = check_int("num_pairs", num_pairs, minimum=1)
    num_values = check_int("num_values", num_values, minimum=1)
    check_generator(generator, torch.device("cpu"))
    order = torch.rand(batch_size, num_pairs, generator=generator).argsort(
        -1
    )  # (b, P): key at slot
    values = torch.randint(
        num_values, (batch_size, num_pairs), generator=generator
    )  # (b, P): value of key t
    first_value = FIRST_SYMBOL + num_pairs
    src = torch.stack(
        [FIRST_SYMBOL + order, first_value + values.gather(-1, order)], dim=-1
    )
    src = src.flatten(1)  # (b, 2P): k v k v ...
    tgt_out = first_value + values  # (b, P): value of key 0, 1, ...
    bos = torch.full((batch_size, 1), BOS, dtype=src.dtype)
    tgt_in = torch.cat([bos, tgt_out[:, :-1]], dim=-1)  # (b, P)
    return ReversalBatch(src, tgt_in, tgt_out)


def encoder_decoder_masks(
    src_lengths: Tensor | Sequence[int],
    tgt_lengths: Tensor | Sequence[int],
    src_len: int,
    tgt_len: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The three masks of an encoder-decoder, shaped for single-head ``(b, i, j)``
    scores.

    True = may attend. Padding is always on the *key* side: a padded query row still
    sees the real keys (its output is ignored by the loss), so no row is fully masked.

    Args:
        src_lengths: ``(b,)`` real source lengths, each in ``[1, src_len]``.
        tgt_lengths: ``(b,)`` real target lengths, each in ``[1, tgt_len]``.
        src_len: padded source length ``j``.
        tgt_len: padded target length ``i``.

    Returns:
        ``(encoder_self, decoder_self, cross)`` of shapes ``(b, 1, src_len)`` (source
        padding), ``(b, tgt_len, tgt_len)`` (causal AND target padding) and
        ``(b, 1, src_len)`` (source padding, broadcast over the decoder's queries).

    Example:
        >>> enc, dec, cross = encoder_decoder_masks([2], [3], 3, 3)
        >>> enc[0].int().tolist(), dec[0].int().tolist()
        ([[1, 1, 0]], [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    """
    src_len = check_int(
        "src_len", src_len, minimum=0
    )  # named here: padding_mask would say j
    tgt_len = check_int("tgt_len", tgt_len, minimum=0)
    src_pad = padding_mask(src_lengths, src_len)[:, 0]  # (b, 1, j)
    tgt_pad = padding_mask(tgt_lengths, tgt_len)[:, 0]  # (b, 1, i)
    if src_pad.shape[0] != tgt_pad.shape[0]:
        raise ValueError(
            "src_lengths and tgt_lengths must have one entry per sequence "
            f"of the batch, got {src_pad.shape[0]} and {tgt_pad.shape[0]}"
        )
    if src_len and src_pad.shape[0] and not src_pad.any(-1).all():
        raise ValueError(
            "every source must have at least one real token (a length >= 1)"
        )
    decoder_self = combine_masks(causal_mask(tgt_len, device=tgt_pad.device), tgt_pad)
    assert decoder_self is not None  # two masks in, their AND out
    return src_pad, decoder_self, src_pad  # (b, 1, j), (b, i, i), (b, 1, j)


class TinySeq2Seq(nn.Module):
    """A one-layer encoder-decoder built from the package's attention modules.

    Encoder: token + learned position embeddings, then one residual self-attention
    (padding mask). Decoder: token + position embeddings, one residual causal
    self-attention, one residual cross-attention to the encoder output, and a linear
    read-out to the vocabulary. No feed-forward blocks or normalisation: the point is
    to watch the cross-attention weights.

    Args:
        vocab_size: ``V``, including ``PAD`` and ``BOS``.
        max_len: longest source or target sequence.
        d_model: model size ``d`` of every embedding and attention.

    Example:
        >>> model = TinySeq2Seq(vocab_size=10, max_len=8, d_model=16)
        >>> src = torch.randint(2, 10, (3, 8)); tgt_in = torch.randint(1, 10, (3, 5))
        >>> logits, cross = model(src, tgt_in, need_weights=True)
        >>> logits.shape, cross.shape
        (torch.Size([3, 5, 10]), torch.Size([3, 5, 8]))
        >>> model(src, tgt_in)[1] is None
        True
    """

    def __init__(self, vocab_size: int, max_len: int, d_model: int = 32):
        super().__init__()
        self.vocab_size = check_int("vocab_size", vocab_size, minimum=FIRST_SYMBOL + 1)
        self.max_len = check_int("max_len", max_len, minimum=1)
        self.d_model = d = check_int("d_model", d_model, minimum=1)
        self.src_embed = nn.Embedding(vocab_size, d)
        self.tgt_embed = nn.Embedding(vocab_size, d)
        self.src_pos = nn.Embedding(max_len, d)
        self.tgt_pos = nn.Embedding(max_len, d)
        self.encoder_attn = SelfAttention(d, d, d)
        self.decoder_attn = SelfAttention(d, d, d)
        self.cross_attn = CrossAttention(d, d, d, d)
        self.readout = nn.Linear(d, vocab_size)

    def _check_tokens(self, name: str, tokens) -> None:
        check_tensor(name, tokens, dtype=torch.long)
        if tokens.dim() != 2:
            raise ValueError(
                f"{name} must be a (b, n) tensor of token ids, "
                f"got shape {tuple(tokens.shape)}"
            )
        check_same_device(**{name: tokens, "the model": self.readout.weight})
        check_has_data(name, tokens)
        if tokens.shape[1] > self.max_len:
            raise ValueError(
                f"{name} has {tokens.shape[1]} positions, "
                f"more than max_len={self.max_len}"
            )
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            raise ValueError(f"{name} token ids must lie in [0, {self.vocab_size - 1}]")

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``(b, j)`` token ids -> ``(b, j, d)`` encoder states; ``src_mask``
        ``(b, 1, j)``."""
        positions = torch.arange(src.shape[1], device=src.device)
        h = self.src_embed(src) + self.src_pos(positions)  # (b, j, d)
        return h + self.encoder_attn(h, attn_mask=src_mask)[0]  # (b, j, d)

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        decoder_mask: Tensor | None = None,
        cross_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``(b, i)`` decoder input and ``(b, j, d)`` memory -> ``(b, i, V)`` logits and
        the ``(b, i, j)`` cross-attention weights."""
        positions = torch.arange(tgt_in.shape[1], device=tgt_in.device)
        h = self.tgt_embed(tgt_in) + self.tgt_pos(positions)  # (b, i, d)
        if decoder_mask is None:
            h = h + self.decoder_attn(h, is_causal=True)[0]
        else:
            h = h + self.decoder_attn(h, attn_mask=decoder_mask)[0]  # (b, i, d)
        context, weights = self.cross_attn(
            h, memory, attn_mask=cross_mask, need_weights=True
        )
        return self.readout(h + context), weights  # (b, i, V), (b, i, j)

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        src_lengths: Tensor | Sequence[int] | None = None,
        tgt_lengths: Tensor | Sequence[int] | None = None,
        *,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced forward pass.

        Args:
            src: ``(b, j)`` source token ids.
            tgt_in: ``(b, i)`` decoder input (``BOS`` then the target shifted right).
            src_lengths / tgt_lengths: ``(b,)`` real lengths when the batch is padded;
                ``None`` means no padding. They build the masks of
                :func:`encoder_decoder_masks`.
            need_weights: return the cross-attention weights too.

        Returns:
            ``(logits, weights)``: ``(b, i, V)`` logits; the ``(b, i, j)``
            cross-attention weights (row = output position, column = source position)
            with ``need_weights=True``, else ``None``.
        """
        self._check_tokens("src", src)
        self._check_tokens("tgt_in", tgt_in)
        check_bool("need_weights", need_weights)
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(
                "src and tgt_in must have the same batch size, "
                f"got {src.shape[0]} and {tgt_in.shape[0]}"
            )
        b, j, i = src.shape[0], src.shape[1], tgt_in.shape[1]
        enc_mask = dec_mask = cross_mask = None
        if src_lengths is not None or tgt_lengths is not None:
            src_lengths = [j] * b if src_lengths is None else src_lengths
            tgt_lengths = [i] * b if tgt_lengths is None else tgt_lengths
            enc_mask, dec_mask, cross_mask = encoder_decoder_masks(
                src_lengths, tgt_lengths, j, i
            )
        memory = self.encode(src, enc_mask)
        logits, weights = self.decode(tgt_in, memory, dec_mask, cross_mask)
        return logits, (weights if need_weights else None)


def train_seq2seq(
    model: TinySeq2Seq,
    steps: int | Iterable,
    *,
    batch_size: int = 64,
    length: int | None = None,
    lr: float = 1e-2,
    seed: int = 0,
    task: str = "reversal",
) -> list[float]:
    """Train ``model`` on a toy task with Adam; deterministic for a given ``seed``.

    Batches come from a ``torch.Generator`` seeded with ``seed``; the loop runs on one
    CPU thread (restored afterwards) so the floating-point sums, hence the losses, are
    the same on every run. The model's own initialisation is the caller's to seed.

    Args:
        model: a :class:`TinySeq2Seq`; trained in place and left in eval mode.
        steps: the number of steps, or any iterable with one item per step, e.g.
            ``tqdm(range(300))`` to show a progress bar.
        batch_size: sequences per step.
        length: sequence length (default ``model.max_len``); for ``"lookup"`` the number
            of pairs (default ``model.max_len // 2``).
        lr: Adam's learning rate.
        seed: seed of the batch generator.
        task: ``"reversal"`` (:func:`reversal_batch`) or ``"lookup"``
            (:func:`lookup_batch`, with ``length`` pairs and every remaining vocabulary
            entry a value symbol).

    Returns:
        The training loss (cross-entropy, nats per token) of every step.
    """
    if not isinstance(model, TinySeq2Seq):
        raise TypeError(f"model must be a TinySeq2Seq, got {type(model).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, (int, Iterable)):
        raise TypeError(
            f"steps must be an int or an iterable, got {type(steps).__name__}"
        )
    if isinstance(
        steps, torch.Tensor
    ):  # iterable, but a 0-d tensor fails deep inside the loop
        raise TypeError(
            "steps must be an int or an iterable (e.g. a range or a tqdm bar), got a "
            "Tensor; pass int(steps)"
        )
    if isinstance(steps, int):
        steps = range(check_int("steps", steps, minimum=0))
    if task not in ("reversal", "lookup"):
        raise ValueError(f"task must be 'reversal' or 'lookup', got {task!r}")
    source_per_item = (
        1 if task == "reversal" else 2
    )  # source positions per target position
    default = model.max_len // source_per_item
    length = default if length is None else check_int("length", length, minimum=1)
    if source_per_item * length > model.max_len:
        limit = (
            f"model.max_len={model.max_len}"
            if task == "reversal"
            else f"{default} (model.max_len={model.max_len} source positions)"
        )
        raise ValueError(f"length must be <= {limit}, got {length}")
    batch_size = check_int("batch_size", batch_size, minimum=1)
    lr = check_real("lr", lr)
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    seed = check_int("seed", seed, minimum=0)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    num_symbols = model.vocab_size - FIRST_SYMBOL
    if task == "lookup" and num_symbols - length < 1:
        raise ValueError(
            f"the lookup task needs a vocabulary of more than {FIRST_SYMBOL + length} "
            f"entries for {length} keys, got vocab_size={model.vocab_size}"
        )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    losses = []
    model.train()
    try:
        for _ in steps:
            if task == "reversal":
                batch = reversal_batch(
                    batch_size, length, num_symbols, generator=generator
                )
            else:
                batch = lookup_batch(
                    batch_size, length, num_symbols - length, generator=generator
                )
            logits, _ = model(batch.src, batch.tgt_in)  # (b, i, V)
            loss = loss_fn(logits.flatten(0, 1), batch.tgt_out.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
        model.eval()
    return losses


@torch.no_grad()
def greedy_decode(model: TinySeq2Seq, src: Tensor, length: int | None = None) -> Tensor:
    """Generate ``length`` tokens (default the source length) one at a time.

    Each step feeds ``BOS`` and the tokens generated so far and keeps the most likely
    next token, so nothing of the target is seen.

    Args:
        model: a :class:`TinySeq2Seq`.
        src: ``(b, j)`` source token ids.
        length: tokens to generate.

    Returns:
        ``(b, length)`` generated token ids.
    """
    if not isinstance(model, TinySeq2Seq):
        raise TypeError(f"model must be a TinySeq2Seq, got {type(model).__name__}")
    model._check_tokens("src", src)
    length = src.shape[1] if length is None else check_int("length", length, minimum=0)
    if length > model.max_len:
        raise ValueError(
            f"length must be <= model.max_len={model.max_len}, got {length}"
        )
    memory = model.encode(src)
    tokens = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
    for _ in range(length):
        logits, _ = model.decode(tokens, memory)  # (b, t, V)
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=-1)
    return tokens[:, 1:]  # (b, length)
