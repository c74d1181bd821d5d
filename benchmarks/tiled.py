"""Tiled exact attention against the materialised form: peak memory and time
(chapter 14).

Contenders, fp32, batch 1, 4 heads, d = e = 64, non-causal, under the protocol of
``_common`` (one thread for time and for memory, passive OpenMP waiting, interleaved,
>= 7 repeats after warm-up):

* ``naive``: ``attention.scaled_dot_product_attention``, which builds the ``(h, N, N)``
  scores and weights;
* ``tiled``: ``attention.tiled_attention(..., block_size=128)``, the online-softmax
  recurrence over key blocks, which only ever holds ``(h, N, 128)`` tiles;
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention``, PyTorch's fused C++
  kernel for the same exact attention (tiled over queries and keys, never storing the
  ``(h, N, N)`` matrix): what a compiled kernel gains over the Python-level loop.

Peak memory is measured in a fresh subprocess per call (``_common.peak_memory_mib``);
times are medians of round-robin runs after warm-up. Prints the memory and time ratios
and saves ``src/attention/benchmark_results/tiled.json``.

Keys: ``n``; ``time_s`` and ``peak_mib`` ``{tiled, naive, sdpa}`` per N (medians);
``memory_ratio`` (tiled / naive peak); ``load_average`` ([before, after]); ``config``.
Added by the protocol: ``time_s_q1``, ``time_s_q3`` (interquartile range, same layout as
``time_s``), ``tiled_over_sdpa`` (median ratio per N) with ``tiled_over_sdpa_separated``
(the two interquartile ranges do not overlap), ``slope_memory`` (log-log, N >= 2048),
``stamp`` and ``quiet`` (see ``_common``).

Run: ``.venv/bin/python benchmarks/tiled.py`` (about two minutes on a quiet machine,
most of it the 7 + 1 calls of each contender at N = 8192: about 7 s of CPU a round).
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
import torch.nn.functional as F
from _common import (
    MEMORY_THREADS,
    THREADS,
    begin,
    finish,
    fit_slope,
    protocol_config,
    ratio,
    separated_at,
    sweep,
)

from attention import scaled_dot_product_attention, tiled_attention

ORDER = 30  # place in run_all.py's session
HEADS, DIM, BLOCK = 4, 64, 128
SIZES, QUICK_SIZES = [256, 512, 1024, 2048, 4096, 8192], [64, 128]


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    return [
        torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(3)
    ]  # (b, h, n, d)


def make_tiled(n: int):
    """Zero-argument callable: tiled attention (block 128) of length n."""
    q, k, v = _inputs(n)
    return lambda: tiled_attention(q, k, v, block_size=BLOCK)


def make_naive(n: int):
    """Zero-argument callable: the package's materialising reference of length n."""
    q, k, v = _inputs(n)
    return lambda: scaled_dot_product_attention(q, k, v)


def make_sdpa(n: int):
    """Zero-argument callable: PyTorch's fused scaled_dot_product_attention."""
    q, k, v = _inputs(n)
    return lambda: F.scaled_dot_product_attention(q, k, v)


def main() -> None:
    run = begin("tiled")
    torch.set_num_threads(THREADS)
    sizes = QUICK_SIZES if run.quick else SIZES
    makers = {"tiled": make_tiled, "naive": make_naive, "sdpa": make_sdpa}
    result = sweep(run, sizes, makers, memory=True, warmup=1)
    memory_ratio = ratio(result, "tiled", "naive", key="peak_mib")
    config = protocol_config(
        run,
        memory_threads=MEMORY_THREADS,
        batch=1,
        heads=HEADS,
        d=DIM,
        dtype="float32",
        block_size=BLOCK,
        is_causal=False,
    )
    finish(
        run,
        {
            "load_average": None,  # filled by finish: [before, after]
            "config": config,
            "n": sizes,
            **result,
            "memory_ratio": memory_ratio,
            "tiled_over_sdpa": ratio(result, "tiled", "sdpa"),
            "tiled_over_sdpa_separated": separated_at(result, "tiled", "sdpa"),
            "slope_memory": fit_slope(
                sizes, result["peak_mib"], start=2048, floor=1e-3
            ),
        },
    )


if __name__ == "__main__":
    main()
