"""Causal linear attention (two chunkwise forms) against fused causal softmax attention
(chapter 10).

Contenders, fp32, batch 1, 4 heads, d = e = 64, under the protocol of ``_common`` (one
thread for time and for memory, passive OpenMP waiting, interleaved, >= 7 repeats):

* ``linear``: ``attention.linear_attention(..., is_causal=True, chunk_size=64)``, the
  parallel chunkwise form (elu + 1 feature map; every chunk's state held at once);
* ``lightning``: ``attention.lightning_attention(..., decay=..., block_size=64)``,
  Lightning Attention-2's sequential block loop (one running state, per-head decay, no
  normaliser);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``,
  PyTorch's fused (flash-style) CPU kernel: exact softmax, O(N^2) time, O(N) memory.

For each N the contenders are timed round-robin and each one's peak memory is measured
in a fresh subprocess. Prints the speed-up and the crossover length (the shortest N from
which linear attention stays faster) and saves
``src/attention/benchmark_results/linear.json``.

Keys: ``n``; ``time_s`` ``{linear, lightning, sdpa}``: medians per N; ``peak_mib``;
``speedup`` (sdpa / linear medians); ``crossover_n``; ``load_average`` ([before,
after]); ``config``. Added by the protocol: ``time_s_q1`` and ``time_s_q3`` (same layout
as ``time_s``: the interquartile range of the repeats), ``speedup_separated`` (per N:
the two contenders' interquartile ranges do not overlap, so the ratio is resolved),
``slope_time`` (``{linear, lightning, sdpa}``: log-log slope of the median time, N >=
2048), ``stamp`` (machine, threads, policy, load before and after) and ``quiet`` (see
``_common``).

Run: ``.venv/bin/python benchmarks/linear.py`` (about a minute on a quiet machine).
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
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

from attention import lightning_attention, linear_attention

ORDER = 20  # place in run_all.py's session
HEADS, DIM, CHUNK = 4, 64, 64
SIZES, QUICK_SIZES = [256, 512, 1024, 2048, 4096, 8192, 16384], [64, 128]
DECAY = -torch.linspace(0.01, 0.5, HEADS)  # per-head log-decay, (h,)


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    return [
        torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(3)
    ]  # (b, h, n, d)


def make_linear(n: int):
    """Zero-argument callable: chunked causal linear attention of length n."""
    q, k, v = _inputs(n)
    return lambda: linear_attention(q, k, v, is_causal=True, chunk_size=CHUNK)


def make_lightning(n: int):
    """Zero-argument callable: Lightning Attention-2's block loop of length n."""
    q, k, v = _inputs(n)
    return lambda: lightning_attention(q, k, v, decay=DECAY, block_size=CHUNK)


def make_sdpa(n: int):
    """Zero-argument callable: fused causal softmax attention (PyTorch) of length n."""
    q, k, v = _inputs(n)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v, is_causal=True)


def crossover(sizes: list[int], ratios: list[float]) -> int | None:
    """Shortest N from which ``ratios`` (softmax time / linear time) stays above 1."""
    best = None
    for n, r in zip(reversed(sizes), reversed(ratios), strict=True):
        if r <= 1.0:
            break
        best = n
    return best


def main() -> None:
    run = begin("linear")
    torch.set_num_threads(THREADS)
    sizes = QUICK_SIZES if run.quick else SIZES
    makers = {"linear": make_linear, "lightning": make_lightning, "sdpa": make_sdpa}
    result = sweep(run, sizes, makers, memory=True)
    speedup = ratio(result, "sdpa", "linear")
    cross = crossover(sizes, speedup)
    print(f"crossover: linear attention is faster from N = {cross} on")
    config = protocol_config(
        run,
        memory_threads=MEMORY_THREADS,
        batch=1,
        heads=HEADS,
        d=DIM,
        dtype="float32",
        chunk_size=CHUNK,
        feature_map="elu+1",
    )
    finish(
        run,
        {
            "load_average": None,  # filled by finish: [before, after]
            "config": config,
            "n": sizes,
            **result,
            "speedup": speedup,
            "speedup_separated": separated_at(result, "linear", "sdpa"),
            "slope_time": fit_slope(sizes, result["time_s"], start=2048),
            "crossover_n": cross,
        },
    )


if __name__ == "__main__":
    main()
