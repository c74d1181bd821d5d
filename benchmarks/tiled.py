"""Tiled exact attention against the materialised form: peak memory and time (chapter 14).

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

Run: ``.venv/bin/python benchmarks/tiled.py`` (about two minutes on a quiet machine, most
of it the 7 + 1 calls of each contender at N = 8192: about 7 s of CPU a round).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OMP_POLICY, set_omp_wait_policy  # noqa: E402

OMP_WAIT_POLICY = set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
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

from attention import scaled_dot_product_attention, tiled_attention  # noqa: E402

HEADS, DIM, BLOCK = 4, 64, 128
SIZES = [256, 512, 1024, 2048, 4096, 8192]
QUICK_SIZES = [256, 512, 1024]


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    return [
        torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(3)
    ]  # (b, h, n, d)


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
    run = begin("tiled")
    sizes = QUICK_SIZES if run.quick else SIZES
    repeat = 3 if run.quick else MIN_REPEAT
    torch.set_num_threads(THREADS)
    names = ("tiled", "naive", "sdpa")
    # Memory first: measured before any large tensor exists in this parent.
    peak = {
        name: [peak_memory_mib(f"tiled:make_{name}", n=n) for n in sizes]
        for name in names
    }
    print(
        f"{'N':>6} {'tiled MiB':>10} {'naive MiB':>10} {'sdpa MiB':>9} {'mem ratio':>10} "
        f"{'tiled ms':>9} {'naive ms':>9} {'sdpa ms':>8}"
    )
    stats = {name: [] for name in names}
    for k, n in enumerate(sizes):
        t = interleaved_stats(
            {"tiled": make_tiled(n), "naive": make_naive(n), "sdpa": make_sdpa(n)},
            warmup=1,
            repeat=repeat,
        )
        for name in names:
            stats[name].append(t[name])
        print(
            f"{n:>6} {peak['tiled'][k]:>10.1f} {peak['naive'][k]:>10.1f} {peak['sdpa'][k]:>9.1f} "
            f"{peak['naive'][k] / max(peak['tiled'][k], 1e-3):>9.1f}x "
            f"{1e3 * t['tiled']['median']:>9.1f} {1e3 * t['naive']['median']:>9.1f} "
            f"{1e3 * t['sdpa']['median']:>8.1f}",
            flush=True,
        )
    times, q1, q3 = {}, {}, {}
    for name in names:
        times[name], q1[name], q3[name] = spread(stats[name])
    i = len(sizes) - 1
    mem_ratio = peak["tiled"][i] / peak["naive"][i]
    print(
        f"N = {sizes[i]}: tiled peak memory is {mem_ratio:.3f} of the naive form's (1/{1 / mem_ratio:.0f})"
    )
    print(
        f"N = {sizes[i]}: tiled time / naive time = {times['tiled'][i] / times['naive'][i]:.2f}"
    )
    print(
        f"N = {sizes[i]}: tiled time / fused sdpa time = {times['tiled'][i] / times['sdpa'][i]:.2f}"
    )
    big = [i for i, n in enumerate(sizes) if n >= 2048]
    big = big if len(big) >= 2 else list(range(len(sizes)))
    finish(
        run,
        {
            "load_average": None,  # filled by finish: [before, after]
            "config": {
                "batch": 1,
                "heads": HEADS,
                "d": DIM,
                "dtype": "float32",
                "block_size": BLOCK,
                "is_causal": False,
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
            "memory_ratio": [
                t / nv for t, nv in zip(peak["tiled"], peak["naive"], strict=True)
            ],
            "tiled_over_sdpa": [
                t / s for t, s in zip(times["tiled"], times["sdpa"], strict=True)
            ],
            "tiled_over_sdpa_separated": [
                separated(a, b)
                for a, b in zip(stats["tiled"], stats["sdpa"], strict=True)
            ],
            "slope_memory": {
                name: log_slope(
                    [sizes[i] for i in big], [max(peak[name][i], 1e-3) for i in big]
                )
                for name in names
            },
        },
        repeat=repeat,
    )


if __name__ == "__main__":
    main()
