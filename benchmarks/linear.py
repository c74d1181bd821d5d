"""Causal linear attention (two chunkwise forms) against fused causal softmax attention (chapter 10).

Contenders, fp32, batch 1, 4 heads, d = e = 64, under the protocol of ``_common`` (one
thread for time and for memory, passive OpenMP waiting, interleaved, >= 7 repeats):

* ``linear``: ``attention.linear_attention(..., is_causal=True, chunk_size=64)``, the
  parallel chunkwise form (elu + 1 feature map; every chunk's state held at once);
* ``lightning``: ``attention.lightning_attention(..., decay=..., block_size=64)``, Lightning
  Attention-2's sequential block loop (one running state, per-head decay, no normaliser);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``,
  PyTorch's fused (flash-style) CPU kernel: exact softmax, O(N^2) time, O(N) memory.

For each N the two are timed round-robin and each one's peak memory is measured in a
fresh subprocess. Prints the speed-up and the crossover length (the shortest N from which
linear attention stays faster) and saves ``src/attention/benchmark_results/linear.json``.

Keys: ``n``; ``time_s`` ``{linear, sdpa}``: medians per N; ``peak_mib``; ``speedup``
(sdpa / linear medians); ``crossover_n``; ``load_average`` ([before, after]); ``config``.
Added by the protocol: ``time_s_q1`` and ``time_s_q3`` (same layout as ``time_s``: the
interquartile range of the repeats), ``speedup_separated`` (per N: the two contenders'
interquartile ranges do not overlap, so the ratio is resolved), ``slope_time``
(``{linear, sdpa}``: log-log slope of the median time, N >= 2048), ``stamp`` (machine,
threads, policy, load before and after) and ``quiet`` (see ``_common``).

Run: ``.venv/bin/python benchmarks/linear.py`` (about a minute on a quiet machine).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OMP_POLICY, set_omp_wait_policy  # noqa: E402

OMP_WAIT_POLICY = set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch  # noqa: E402
from _common import (  # noqa: E402
    MEMORY_THREADS,
    MIN_REPEAT,
    THREADS,
    begin,
    finish,
    interleaved_stats,
    log_slope,
    peak_memory_mib,
    separated,
    spread,
)

from attention import lightning_attention, linear_attention  # noqa: E402

HEADS, DIM, CHUNK = 4, 64, 64
SIZES = [256, 512, 1024, 2048, 4096, 8192, 16384]
QUICK_SIZES = [256, 512, 1024]
DECAY = -torch.linspace(0.01, 0.5, HEADS)  # per-head log-decay, (h,)


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    return [
        torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(3)
    ]  # (b, h, n, d)


def _linear(q, k, v):
    return linear_attention(q, k, v, is_causal=True, chunk_size=CHUNK)


def _lightning(q, k, v):
    return lightning_attention(q, k, v, decay=DECAY, block_size=CHUNK)


def _sdpa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def _prepared(fn, n: int):
    """Inputs of length n and a zero-argument call (``peak_memory_mib`` warms it up itself)."""
    q, k, v = _inputs(n)
    return lambda: fn(q, k, v)


def make_linear(n: int):
    """Zero-argument callable: chunked causal linear attention on fresh inputs of length n."""
    return _prepared(_linear, n)


def make_lightning(n: int):
    """Zero-argument callable: Lightning Attention-2's block loop on inputs of length n."""
    return _prepared(_lightning, n)


def make_sdpa(n: int):
    """Zero-argument callable: fused causal softmax attention (PyTorch) of length n."""
    return _prepared(_sdpa, n)


def crossover(sizes: list[int], ratio: list[float]) -> int | None:
    """Shortest N from which ``ratio`` (softmax time / linear time) stays above 1."""
    best = None
    for n, r in zip(reversed(sizes), reversed(ratio), strict=True):
        if r <= 1.0:
            break
        best = n
    return best


def main() -> None:
    run = begin("linear")
    sizes = QUICK_SIZES if run.quick else SIZES
    repeat = 3 if run.quick else MIN_REPEAT
    torch.set_num_threads(THREADS)
    names = ("linear", "lightning", "sdpa")
    # Memory first: measured before any large tensor exists in this parent.
    peak = {
        name: [peak_memory_mib(f"linear:make_{name}", n=n) for n in sizes]
        for name in names
    }
    stats = {name: [] for name in names}
    print(
        f"{'N':>6} {'linear ms':>10} {'sdpa ms':>10} {'speed-up':>9} {'linear MiB':>11} {'sdpa MiB':>9}"
    )
    for k, n in enumerate(sizes):
        t = interleaved_stats(
            {
                "linear": make_linear(n),
                "lightning": make_lightning(n),
                "sdpa": make_sdpa(n),
            },
            warmup=2,
            repeat=repeat,
        )
        for name in names:
            stats[name].append(t[name])
        print(
            f"{n:>6} {1e3 * t['linear']['median']:>10.2f} {1e3 * t['sdpa']['median']:>10.2f} "
            f"{t['sdpa']['median'] / t['linear']['median']:>8.1f}x {peak['linear'][k]:>11.1f} "
            f"{peak['sdpa'][k]:>9.1f}",
            flush=True,
        )
    times, q1, q3 = {}, {}, {}
    for name in names:
        times[name], q1[name], q3[name] = spread(stats[name])
    speedup = [s / lin for s, lin in zip(times["sdpa"], times["linear"], strict=True)]
    resolved = [
        separated(a, b) for a, b in zip(stats["linear"], stats["sdpa"], strict=True)
    ]
    cross = crossover(sizes, speedup)
    big = [i for i, n in enumerate(sizes) if n >= 2048]
    big = big if len(big) >= 2 else list(range(len(sizes)))
    slopes = {
        name: log_slope([sizes[i] for i in big], [times[name][i] for i in big])
        for name in names
    }
    print(
        f"crossover: linear attention is faster from N = {cross} on; time slopes (N >= 2048): "
        + ", ".join(f"{k} {v:.2f}" for k, v in slopes.items())
    )
    finish(
        run,
        {
            "load_average": None,  # filled by finish: [before, after]
            "config": {
                "batch": 1,
                "heads": HEADS,
                "d": DIM,
                "dtype": "float32",
                "chunk_size": CHUNK,
                "feature_map": "elu+1",
                "threads": THREADS,
                "memory_threads": MEMORY_THREADS,
                "omp_wait_policy": OMP_WAIT_POLICY,
                "repeat": repeat,
            },
            "n": sizes,
            "time_s": times,
            "time_s_q1": q1,
            "time_s_q3": q3,
            "peak_mib": peak,
            "speedup": speedup,
            "speedup_separated": resolved,
            "slope_time": slopes,
            "crossover_n": cross,
        },
        repeat=repeat,
    )


if __name__ == "__main__":
    main()
