"""What the block table costs: one decode step from a paged cache against a contiguous
one (chapter 18).

Setting: a batch of 4 sequences, each holding ``L`` cached positions, 8 heads (as many
key/value heads), d = 64, fp32, pool blocks of 16 positions, ``torch.inference_mode()``,
under the protocol of ``_common`` (one thread, passive OpenMP waiting, contenders
interleaved, 21 repeats after warm-up, median and quartiles). Every call decodes the
same token ``L + 1`` (the previous call's token is dropped first).

Contenders (all three use the package's ``scaled_dot_product_attention``, so the only
difference is where the keys and values come from):

* ``contiguous``: ``KVCache.update`` (one slice write per step) and attention over the
  ``(b, h, L + 1, d)`` views of the buffers;
* ``paged``: ``PagedKVCache.append`` for each sequence (a scatter through its block
  table) and ``PagedKVCache.attend``, which gathers every sequence's blocks through the
  table into a padded batch and masks the padding (a real paged kernel reads the blocks
  in place; the gather is this implementation's indirection);
* ``paged_gather``: only the gathers of ``attend`` (``PagedKVCache.gather`` per
  sequence), to show which part of the gap is the copy.

The outputs of ``contiguous`` and ``paged`` are checked to agree before timing.

Saved keys: ``contexts``; ``time_s``, ``time_s_q1``, ``time_s_q3`` (``{contender: [per
L]}``); ``paged_over_contiguous`` (median ratio per L) and
``paged_over_contiguous_separated`` (the two interquartile ranges do not overlap);
``config``; ``stamp``, ``quiet`` (``_common``).

Run: ``.venv/bin/python benchmarks/paged.py`` (about twenty seconds on a quiet machine).
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
from _common import (
    THREADS,
    agree,
    begin,
    finish,
    protocol_config,
    ratio,
    separated_at,
    sweep,
)

from attention import KVCache, PagedKVCache, scaled_dot_product_attention

ORDER = 80  # place in run_all.py's session
BATCH, HEADS, DIM, BLOCK = 4, 8, 64, 16
CONTEXTS, QUICK_CONTEXTS = [256, 512, 1024, 2048, 4096], [64, 128]
REPEAT = 21  # calls of a millisecond or less: more samples are cheap


def contenders(length: int) -> dict:
    """The three ways to decode token ``length + 1``, on the same prefix."""
    g = torch.Generator().manual_seed(length)
    shape = (BATCH, HEADS, length, DIM)
    prefix_k, prefix_v = (torch.randn(shape, generator=g) for _ in range(2))
    q, k, v = (torch.randn(BATCH, HEADS, 1, DIM, generator=g) for _ in range(3))

    flat = KVCache(BATCH, length + 1, num_kv_heads=HEADS, head_dim=DIM)
    flat.update(prefix_k, prefix_v)
    # every sequence's blocks, and some spare
    pool = PagedKVCache(BATCH * -(-(length + 1) // BLOCK) + BATCH, BLOCK, HEADS, DIM)
    seqs = [pool.add_sequence() for _ in range(BATCH)]
    # Interleave the sequences' appends, as concurrent requests do: their blocks
    # alternate in the pool.
    for start in range(0, length, BLOCK):
        for row, s in enumerate(seqs):
            chunk = slice(start, start + BLOCK)
            pool.append(s, prefix_k[row, :, chunk], prefix_v[row, :, chunk])

    def contiguous():
        flat.length = length  # drop the previous call's token
        keys, values = flat.update(k, v)
        return scaled_dot_product_attention(q, keys, values)

    def paged():
        for row, s in enumerate(seqs):
            pool.lengths[s] = length  # drop the previous call's token (its block stays)
            pool.append(s, k[row], v[row])
        return pool.attend(q, seqs)

    def paged_gather():
        return [pool.gather(s) for s in seqs]

    return {"contiguous": contiguous, "paged": paged, "paged_gather": paged_gather}


def main() -> None:
    run = begin("paged")
    torch.set_num_threads(THREADS)
    contexts = QUICK_CONTEXTS if run.quick else CONTEXTS
    repeat = run.repeat if run.quick else max(run.repeat, REPEAT)
    check = agree("contiguous", "paged", atol=1e-5)
    result = sweep(run, contexts, contenders, check=check, repeat=repeat, label="L")
    config = protocol_config(
        run,
        batch=BATCH,
        heads=HEADS,
        kv_heads=HEADS,
        d=DIM,
        block_size=BLOCK,
        dtype="float32",
        kernel="attention.scaled_dot_product_attention",
        repeat=repeat,
    )
    finish(
        run,
        {
            "config": config,
            "contexts": contexts,
            **result,
            "paged_over_contiguous": ratio(result, "paged", "contiguous"),
            "paged_over_contiguous_separated": separated_at(
                result, "paged", "contiguous"
            ),
        },
        repeat=repeat,
    )


if __name__ == "__main__":
    main()
