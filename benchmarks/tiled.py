"""Tiled exact attention against the materialised form: peak memory and time (chapter 13).

Contenders, fp32, batch 1, 4 heads, d = e = 64, non-causal, 2 threads:

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

Run: ``.venv/bin/python benchmarks/tiled.py`` (a few minutes).
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
import torch.nn.functional as F  # noqa: E402
from _common import interleaved_times, peak_memory_mib, save_results, stamp  # noqa: E402

from attention import scaled_dot_product_attention, tiled_attention  # noqa: E402

THREADS = 2
HEADS, DIM, BLOCK = 4, 64, 128
SIZES = [256, 512, 1024, 2048, 4096, 8192]


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    return [torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(3)]  # (b, h, n, d)


def _tiled(q, k, v):
    return tiled_attention(q, k, v, block_size=BLOCK)


def _prepared(fn, n: int):
    """Inputs of length n and a zero-argument call (``peak_memory_mib`` warms it up itself)."""
    q, k, v = _inputs(n)
    return lambda: fn(q, k, v)


def make_tiled(n: int):
    """Zero-argument callable: tiled attention (block 128) on fresh inputs of length n."""
    return _prepared(_tiled, n)


def make_naive(n: int):
    """Zero-argument callable: the package's materialising reference of length n."""
    return _prepared(scaled_dot_product_attention, n)


def make_sdpa(n: int):
    """Zero-argument callable: PyTorch's fused scaled_dot_product_attention of length n."""
    return _prepared(F.scaled_dot_product_attention, n)


def main() -> None:
    torch.set_num_threads(THREADS)
    load_before = os.getloadavg()[0]
    times = {"tiled": [], "naive": [], "sdpa": []}
    # Memory first: a probe's peak RSS includes this parent's peak at the time it is
    # spawned (exec carries it over), so measure before any large tensor exists here.
    peak = {name: [peak_memory_mib(f"tiled:make_{name}", n=n) for n in SIZES] for name in times}
    print(f"{'N':>6} {'tiled MiB':>10} {'naive MiB':>10} {'sdpa MiB':>9} {'mem ratio':>10} "
          f"{'tiled ms':>9} {'naive ms':>9} {'sdpa ms':>8}")
    for k, n in enumerate(SIZES):
        repeat = 5 if n <= 2048 else 3
        t = interleaved_times(
            {"tiled": make_tiled(n), "naive": make_naive(n), "sdpa": make_sdpa(n)}, warmup=1, repeat=repeat
        )
        for name in times:
            times[name].append(t[name])
        print(
            f"{n:>6} {peak['tiled'][k]:>10.1f} {peak['naive'][k]:>10.1f} {peak['sdpa'][k]:>9.1f} "
            f"{peak['naive'][k] / max(peak['tiled'][k], 1e-3):>9.1f}x "
            f"{1e3 * t['tiled']:>9.1f} {1e3 * t['naive']:>9.1f} {1e3 * t['sdpa']:>8.1f}"
        )
    i = SIZES.index(8192)
    mem_ratio = peak["tiled"][i] / peak["naive"][i]
    print(f"N = 8192: tiled peak memory is {mem_ratio:.3f} of the naive form's (1/{1 / mem_ratio:.0f})")
    print(f"N = 8192: tiled time / naive time = {times['tiled'][i] / times['naive'][i]:.2f}")
    print(f"N = 8192: tiled time / fused sdpa time = {times['tiled'][i] / times['sdpa'][i]:.2f}")
    path = save_results(
        "tiled",
        {
            "stamp": stamp(THREADS),
            # 1-minute load average before and after: other jobs on the machine skew times.
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "config": {
                "batch": 1,
                "heads": HEADS,
                "d": DIM,
                "dtype": "float32",
                "block_size": BLOCK,
                "is_causal": False,
                "memory_threads": 1,
                "omp_wait_policy": OMP_WAIT_POLICY,
            },
            "n": SIZES,
            "time_s": times,
            "peak_mib": peak,
            "memory_ratio": [t / nv for t, nv in zip(peak["tiled"], peak["naive"], strict=True)],
        },
    )
    print(f"saved {path}")


if __name__ == "__main__":
    main()
