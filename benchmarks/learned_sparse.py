"""Attention that learns where to look, against fused dense attention (chapter 13).

Causal self-attention, fp32, batch 1, 4 query heads sharing 1 key/value head (a GQA
group, as NSA's kernel assumes), d = e = 64, under the protocol of ``_common`` (one
thread for time and for memory, passive OpenMP waiting, contenders interleaved,
>= 7 repeats after warm-up, median and quartiles saved; extra peak memory of one call in
a fresh process). Every selecting method gets the same budget of ``BUDGET`` = 512 keys
per query:

* ``sdpa``: PyTorch's fused ``scaled_dot_product_attention(is_causal=True,
  enable_gqa=True)``: every past key, O(n^2) time, O(n) memory;
* ``nsa``: ``attention.native_sparse_attention``, blocks of 64, 8 selected blocks (the
  first, the previous and the own block among them), no window branch, so that the
  selected keys are the budget (the compressed branch still scores every complete block:
  n / 64 scores per query);
* ``moba``: ``attention.moba_attention``, blocks of 64, ``top_k`` = 8 (the own block
  among them), each query head choosing for itself;
* ``dsa``: ``attention.deepseek_sparse_attention``, ``top_k`` = 512 keys, an indexer of
  4 heads of size 32 with per-token head weights;
* ``dsa_indexer``: ``attention.lightning_indexer`` alone, with the same inputs: the part
  of ``dsa`` whose cost grows as n^2 (every query scores every past key).

Saved keys: ``n``; ``time_s``, ``time_s_q1``, ``time_s_q3`` (``{name: [one per n]}``);
``peak_mib`` (same layout); ``keys_per_query`` (``{name: [mean keys a query attends to,
counted from the selections at each n]}``, ``sdpa``: (n + 1) / 2); ``ratio_to_sdpa``
(``{name: [median / sdpa median]}``, above 1 the method is slower) and
``ratio_to_sdpa_separated`` (the two interquartile ranges do not overlap);
``slope_time`` and ``slope_memory`` (``{name: log-log slope over all n}``, 1 = linear,
2 = quadratic); ``config``; ``stamp`` and ``quiet`` (see ``_common``).

Before timing, each method is checked against dense attention with the mask of its own
selection (float64, a short sequence), so the timed calls compute the right thing.

Run: ``.venv/bin/python benchmarks/learned_sparse.py`` (a few minutes on a quiet
machine); results go to ``src/attention/benchmark_results/learned_sparse.json``.
``--quick`` runs two short lengths with 3 repeats, to check that the script runs.
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
from _common import (
    THREADS,
    begin,
    finish,
    fit_slope,
    protocol_config,
    ratio,
    separated_at,
    sweep,
)

ORDER = 65  # place in run_all.py's session: after approximate
HEADS, KV_HEADS, DIM = 4, 1, 64
BLOCK, BLOCKS = 64, 8  # NSA and MoBA: 8 blocks of 64 keys
BUDGET = BLOCK * BLOCKS  # keys per query for every selecting method
INDEX_HEADS, INDEX_DIM = 4, 32  # DSA's lightning indexer
SIZES = [1024, 2048, 4096, 8192]
QUICK_SIZES = [256, 512]
NAMES = ("sdpa", "nsa", "moba", "dsa", "dsa_indexer")


def _inputs(n: int, dtype=torch.float32):
    """Queries, keys, values and the indexer's inputs of one sequence of ``n``."""
    g = torch.Generator().manual_seed(n)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    q = randn(1, HEADS, n, DIM)
    k, v = randn(1, KV_HEADS, n, DIM), randn(1, KV_HEADS, n, DIM)
    index_q = randn(1, INDEX_HEADS, n, INDEX_DIM)
    index_k = randn(1, n, INDEX_DIM)
    index_w = torch.rand(1, INDEX_HEADS, n, generator=g, dtype=dtype)
    return q, k, v, index_q, index_k, index_w


# ---- zero-argument callables, also built in the memory probe's subprocess ----------


def sdpa_call(n: int):
    q, k, v, *_ = _inputs(n)
    return lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True
    )


def nsa_call(n: int):
    from attention import native_sparse_attention

    q, k, v, *_ = _inputs(n)
    return lambda: native_sparse_attention(
        q, k, v, block_size=BLOCK, num_selected_blocks=BLOCKS
    )


def moba_call(n: int):
    from attention import moba_attention

    q, k, v, *_ = _inputs(n)
    return lambda: moba_attention(q, k, v, block_size=BLOCK, top_k=BLOCKS)


def dsa_call(n: int):
    from attention import deepseek_sparse_attention

    q, k, v, iq, ik, iw = _inputs(n)
    return lambda: deepseek_sparse_attention(q, k, v, iq, ik, iw, top_k=BUDGET)


def dsa_indexer_call(n: int):
    from attention import lightning_indexer

    _, _, _, iq, ik, iw = _inputs(n)
    return lambda: lightning_indexer(iq, ik, iw, top_k=BUDGET)


CALLS = {
    "sdpa": sdpa_call,
    "nsa": nsa_call,
    "moba": moba_call,
    "dsa": dsa_call,
    "dsa_indexer": dsa_indexer_call,
}


def keys_per_query(n: int) -> dict:
    """Mean number of keys a query attends to, counted from each method's selection."""
    from attention import (
        lightning_indexer,
        moba_attention,
        native_sparse_attention,
        selection_mask,
    )

    q, k, v, iq, ik, iw = _inputs(n)
    _, nsa = native_sparse_attention(
        q, k, v, block_size=BLOCK, num_selected_blocks=BLOCKS, return_block_indices=True
    )
    _, moba = moba_attention(
        q, k, v, block_size=BLOCK, top_k=BLOCKS, return_block_indices=True
    )
    dsa = lightning_indexer(iq, ik, iw, top_k=BUDGET)

    def mean_keys(blocks, block_size):
        return float(
            selection_mask(blocks, block_size=block_size).sum(-1).double().mean()
        )

    return {
        "sdpa": (n + 1) / 2,
        "nsa": mean_keys(nsa, BLOCK),
        "moba": mean_keys(moba, BLOCK),
        "dsa": mean_keys(dsa, 1),
        "dsa_indexer": (n + 1) / 2,  # it scores every past key
    }


def check_against_dense() -> None:
    """Each method equals dense attention with the mask of its selection (float64)."""
    from attention import (
        deepseek_sparse_attention,
        lightning_indexer,
        moba_attention,
        native_sparse_attention,
        scaled_dot_product_attention,
        selection_mask,
    )

    n = 3 * BLOCK + 5  # not a multiple of the block
    q, k, v, iq, ik, iw = _inputs(n, torch.float64)

    def dense(chosen):  # chosen: (..., h or h_kv or 1, n, n), True = may attend
        return scaled_dot_product_attention(q, k, v, chosen, enable_gqa=True)

    # NSA with only its selected branch weighted: the compressed branch is still
    # computed (it ranks the blocks) but a zero gate drops it from the sum
    zero = torch.zeros(1, HEADS, n, dtype=torch.float64)
    out, blocks = native_sparse_attention(
        q,
        k,
        v,
        gate_compressed=zero,
        block_size=BLOCK,
        num_selected_blocks=2,
        return_block_indices=True,
    )
    chosen = selection_mask(blocks, block_size=BLOCK).repeat_interleave(HEADS, -3)
    assert torch.allclose(out, dense(chosen), atol=1e-10), "nsa"
    out, blocks = moba_attention(
        q, k, v, block_size=BLOCK, top_k=2, return_block_indices=True
    )
    assert torch.allclose(out, dense(selection_mask(blocks, block_size=BLOCK))), "moba"
    out = deepseek_sparse_attention(q, k, v, iq, ik, iw, top_k=BLOCK)
    picks = lightning_indexer(iq, ik, iw, top_k=BLOCK)
    assert torch.allclose(out, dense(selection_mask(picks).unsqueeze(-3))), "dsa"


def main() -> None:
    run = begin("learned_sparse")
    torch.set_num_threads(THREADS)
    sizes = QUICK_SIZES if run.quick else SIZES
    check_against_dense()
    result = sweep(run, sizes, CALLS, memory=True, warmup=1)
    keys = {name: [] for name in NAMES}
    for n in sizes:
        for name, count in keys_per_query(n).items():
            keys[name].append(count)
    others = [name for name in NAMES if name != "sdpa"]
    config = protocol_config(
        run,
        dtype="float32",
        batch=1,
        heads=HEADS,
        kv_heads=KV_HEADS,
        d=DIM,
        block_size=BLOCK,
        selected_blocks=BLOCKS,
        budget_keys=BUDGET,
        nsa_window=0,
        index_heads=INDEX_HEADS,
        index_dim=INDEX_DIM,
    )
    finish(
        run,
        {
            "config": config,
            "n": sizes,
            "contenders": list(NAMES),
            **result,
            "keys_per_query": keys,
            "ratio_to_sdpa": {name: ratio(result, name, "sdpa") for name in others},
            "ratio_to_sdpa_separated": {
                name: separated_at(result, name, "sdpa") for name in others
            },
            "slope_time": fit_slope(sizes, result["time_s"]),
            "slope_memory": fit_slope(sizes, result["peak_mib"], floor=1e-3),
        },
    )


if __name__ == "__main__":
    main()
