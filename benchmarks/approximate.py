"""LSH and Linformer attention against n: is their cost O(n k) as claimed? (chapter 13)

Contenders, fp32, batch 1, 4 heads, d = e = 64, under the protocol of ``_common`` (one
thread for time and for memory, passive OpenMP waiting, contenders interleaved, >= 7
repeats after warm-up, median and quartiles):

* ``lsh``: ``attention.lsh_attention(x, x, v, num_buckets=32, num_hashes=2,
  chunk_size=64)``: Reformer's shared-QK attention; each query sees its chunk and the one
  before (128 keys) in each of 2 rounds, plus a sort of n positions per round: O(n c r)
  arithmetic and O(n log n) sorting;
* ``linformer``: ``attention.linformer_attention`` with fixed random projections
  ``E = F`` of ``k = 256`` rows (``linformer_projection``): O(n k) scores;
* ``sdpa``: PyTorch's fused exact attention (O(n^2) time, O(n) memory), for scale, up to
  ``SDPA_MAX``.

Saved keys: ``n``; ``time_s``, ``time_s_q1``, ``time_s_q3`` (``{lsh, linformer, sdpa}``,
one entry per n, ``None`` where not run); ``peak_mib`` (same layout; extra peak memory of
one call, fresh subprocess); ``slope_time`` and ``slope_memory`` (``{name: log-log slope}``
over ``n >= 2048``: 1 = linear growth, 2 = quadratic); ``local_slope_time``
(``{name: [slope between neighbouring sizes]}``); ``config``; ``stamp``, ``quiet``
(``_common``).

Run: ``.venv/bin/python benchmarks/approximate.py`` (about a minute and a half on a quiet
machine).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OMP_POLICY, set_omp_wait_policy  # noqa: E402

OMP_WAIT_POLICY = set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch  # noqa: E402
from _common import (  # noqa: E402
    MIN_REPEAT,
    THREADS,
    begin,
    finish,
    interleaved_stats,
    log_slope,
    peak_memory_mib,
)

HEADS, DIM = 4, 64
BUCKETS, HASHES, CHUNK = 32, 2, 64
RANK = 256  # Linformer's k
SIZES = [1024, 2048, 4096, 8192, 16384]
SDPA_MAX = 8192
QUICK_SIZES = [512, 1024]
NAMES = ("lsh", "linformer", "sdpa")


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    return [
        torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(3)
    ]  # (b, h, n, d)


def make_lsh(n: int):
    """Zero-argument callable: LSH attention (shared queries and keys) of length n."""
    from attention import lsh_attention

    x, _, v = _inputs(n)
    gen = torch.Generator().manual_seed(0)

    def call():
        gen.manual_seed(0)  # the same hash rotations every call
        return lsh_attention(
            x,
            x,
            v,
            num_buckets=BUCKETS,
            num_hashes=HASHES,
            chunk_size=CHUNK,
            generator=gen,
        )

    return call


def make_linformer(n: int):
    """Zero-argument callable: Linformer attention with fixed (k, n) projections."""
    from attention import linformer_attention
    from attention.efficient.approximate import linformer_projection

    q, k, v = _inputs(n)
    proj = linformer_projection(n, RANK, generator=torch.Generator().manual_seed(1))
    return lambda: linformer_attention(
        q, k, v, key_projection=proj, value_projection=proj
    )


def make_sdpa(n: int):
    """Zero-argument callable: PyTorch's fused exact attention of length n."""
    q, k, v = _inputs(n)
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)


MAKERS = {"lsh": make_lsh, "linformer": make_linformer, "sdpa": make_sdpa}


def main() -> None:
    run = begin("approximate")
    sizes = QUICK_SIZES if run.quick else SIZES
    sdpa_max = sizes[-1] if run.quick else SDPA_MAX
    repeat = 3 if run.quick else MIN_REPEAT
    torch.set_num_threads(THREADS)

    def runs(name, n):
        return name != "sdpa" or n <= sdpa_max

    peak = {
        name: [
            peak_memory_mib(f"approximate:make_{name}", n=n) if runs(name, n) else None
            for n in sizes
        ]
        for name in NAMES
    }
    med, q1, q3 = ({name: [] for name in NAMES} for _ in range(3))
    for n in sizes:
        t = interleaved_stats(
            {name: MAKERS[name](n) for name in NAMES if runs(name, n)},
            warmup=1,
            repeat=repeat,
        )
        for name in NAMES:
            med[name].append(t[name]["median"] if name in t else None)
            q1[name].append(t[name]["q1"] if name in t else None)
            q3[name].append(t[name]["q3"] if name in t else None)
        print(
            f"n = {n:>6}: "
            + "  ".join(
                f"{name} {1e3 * t[name]['median']:8.1f} ms ({peak[name][sizes.index(n)]:.1f} MiB)"
                for name in t
            ),
            flush=True,
        )
    slope_time, slope_memory, local = {}, {}, {}
    for name in NAMES:
        fit = [i for i, n in enumerate(sizes) if med[name][i] is not None and n >= 2048]
        fit = (
            fit
            if len(fit) >= 2
            else [i for i in range(len(sizes)) if med[name][i] is not None]
        )
        ns = [sizes[i] for i in fit]
        slope_time[name] = log_slope(ns, [med[name][i] for i in fit])
        slope_memory[name] = log_slope(ns, [max(peak[name][i], 1e-3) for i in fit])
        local[name] = [
            log_slope(ns[k : k + 2], [med[name][i] for i in fit[k : k + 2]])
            for k in range(len(fit) - 1)
        ]
    print(
        "log-log slopes, n >= 2048: "
        + ", ".join(
            f"{name} time {slope_time[name]:.2f} memory {slope_memory[name]:.2f}"
            for name in NAMES
        )
    )
    finish(
        run,
        {
            "config": {
                "batch": 1,
                "heads": HEADS,
                "d": DIM,
                "dtype": "float32",
                "lsh_num_buckets": BUCKETS,
                "lsh_num_hashes": HASHES,
                "lsh_chunk_size": CHUNK,
                "linformer_k": RANK,
                "sdpa_max_n": sdpa_max,
                "threads": THREADS,
                "omp_wait_policy": OMP_WAIT_POLICY,
                "repeat": repeat,
            },
            "n": sizes,
            "time_s": med,
            "time_s_q1": q1,
            "time_s_q3": q3,
            "peak_mib": peak,
            "slope_time": slope_time,
            "slope_memory": slope_memory,
            "local_slope_time": local,
        },
        repeat=repeat,
    )


if __name__ == "__main__":
    main()
