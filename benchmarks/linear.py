"""Causal linear attention (two chunkwise forms) against fused causal softmax attention (chapter 10).

Contenders, fp32, batch 1, 4 heads, d = e = 64, 2 threads:

* ``linear``: ``attention.linear_attention(..., is_causal=True, chunk_size=64)``, the
  parallel chunkwise form (elu + 1 feature map; every chunk's state held at once);
* ``lightning``: ``attention.lightning_attention(..., decay=..., block_size=64)``, Lightning
  Attention-2's sequential block loop (one running state, per-head decay, no normaliser);
* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)``,
  PyTorch's fused (flash-style) CPU kernel: exact softmax, O(N^2) time, O(N) memory.

For each N the two are timed round-robin (medians after warm-up) and each one's peak
memory is measured in a fresh subprocess. Prints the speed-up and the crossover length
(the shortest N from which linear attention stays faster) and saves
``src/attention/benchmark_results/linear.json``.

Run: ``.venv/bin/python benchmarks/linear.py`` (about two minutes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import set_omp_wait_policy  # noqa: E402

# Passive: many small operations (hundreds of ms at N = 256 under load with spinning
# threads); see _common.set_omp_wait_policy. Chosen before torch loads.
OMP_WAIT_POLICY = set_omp_wait_policy("passive")

import torch  # noqa: E402
from _common import interleaved_times, peak_memory_mib, save_results, stamp  # noqa: E402

from attention import lightning_attention, linear_attention  # noqa: E402

THREADS = 2
HEADS, DIM, CHUNK = 4, 64, 64
SIZES = [256, 512, 1024, 2048, 4096, 8192, 16384]


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    return [torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(3)]  # (b, h, n, d)


def _linear(q, k, v):
    return linear_attention(q, k, v, is_causal=True, chunk_size=CHUNK)


DECAY = -torch.linspace(0.01, 0.5, HEADS)  # per-head log-decay, (h,)


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
    torch.set_num_threads(THREADS)
    load_before = os.getloadavg()[0]
    times = {"linear": [], "lightning": [], "sdpa": []}
    # Memory first: a probe's peak RSS includes this parent's peak at the time it is
    # spawned (exec carries it over), so measure before any large tensor exists here.
    peak = {name: [peak_memory_mib(f"linear:make_{name}", n=n) for n in SIZES] for name in times}
    print(f"{'N':>6} {'linear ms':>10} {'sdpa ms':>10} {'speed-up':>9} {'linear MiB':>11} {'sdpa MiB':>9}")
    for k, n in enumerate(SIZES):
        repeat = 7 if n <= 4096 else 5
        t = interleaved_times({"linear": make_linear(n), "lightning": make_lightning(n),
                               "sdpa": make_sdpa(n)}, warmup=2, repeat=repeat)
        for name in times:
            times[name].append(t[name])
        print(
            f"{n:>6} {1e3 * t['linear']:>10.2f} {1e3 * t['sdpa']:>10.2f} "
            f"{t['sdpa'] / t['linear']:>8.1f}x {peak['linear'][k]:>11.1f} {peak['sdpa'][k]:>9.1f} "
            f"lightning {1e3 * t['lightning']:.2f} ms {peak['lightning'][k]:.1f} MiB"
        )
    speedup = [s / lin for s, lin in zip(times["sdpa"], times["linear"], strict=True)]
    cross = crossover(SIZES, speedup)
    print(f"crossover: linear attention is faster from N = {cross} on")
    for n in (8192, 16384):
        print(f"speed-up at N = {n}: {speedup[SIZES.index(n)]:.1f}x")
    path = save_results(
        "linear",
        {
            "stamp": stamp(THREADS),
            # 1-minute load average before and after: other jobs on the machine skew times.
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "config": {
                "batch": 1,
                "heads": HEADS,
                "d": DIM,
                "dtype": "float32",
                "chunk_size": CHUNK,
                "feature_map": "elu+1",
                "lightning_log_decay": DECAY.tolist(),
                "memory_threads": 1,
                "omp_wait_policy": OMP_WAIT_POLICY,
            },
            "n": SIZES,
            "time_s": times,
            "peak_mib": peak,
            "speedup": speedup,
            "crossover_n": cross,
        },
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
