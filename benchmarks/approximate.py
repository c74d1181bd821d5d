"""LSH and Linformer attention against n: is their cost O(n k) as claimed? (chapter 13)

Contenders, fp32, batch 1, 4 heads, d = e = 64, under the protocol of ``_common`` (one
thread for time and for memory, passive OpenMP waiting, contenders interleaved, >= 7
repeats after warm-up, median and quartiles):

* ``lsh``: ``attention.lsh_attention(x, x, v, num_buckets=32, num_hashes=2,
  chunk_size=64)``: Reformer's shared-QK attention; each query sees its chunk and the
  one before (128 keys) in each of 2 rounds, plus a sort of n positions per round:
  O(n c r) arithmetic and O(n log n) sorting;
* ``linformer``: ``attention.linformer_attention`` with fixed random projections
  ``E = F`` of ``k = 256`` rows (``linformer_projection``): O(n k) scores;
* ``sdpa``: PyTorch's fused exact attention (O(n^2) time, O(n) memory), for scale, up to
  ``SDPA_MAX``.

Saved keys: ``n``; ``time_s``, ``time_s_q1``, ``time_s_q3`` (``{lsh, linformer, sdpa}``,
one entry per n, ``None`` where not run); ``peak_mib`` (same layout; extra peak memory
of one call, fresh subprocess); ``slope_time`` and ``slope_memory`` (``{name: log-log
slope}`` over ``n >= 2048``: 1 = linear growth, 2 = quadratic); ``local_slope_time``
(``{name: [slope between neighbouring sizes]}``); ``config``; ``stamp``, ``quiet``
(``_common``).

Run: ``.venv/bin/python benchmarks/approximate.py`` (about a minute and a half on a
quiet machine).
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
    local_slopes,
    protocol_config,
    sweep,
)

from attention import linformer_attention, lsh_attention
from attention.efficient.approximate import linformer_projection

ORDER = 60  # place in run_all.py's session
HEADS, DIM = 4, 64
BUCKETS, HASHES, CHUNK = 32, 2, 64
RANK = 256  # Linformer's k
SIZES, QUICK_SIZES = [1024, 2048, 4096, 8192, 16384], [256, 512]
SDPA_MAX = 8192


def _inputs(n: int):
    g = torch.Generator().manual_seed(n)
    return [
        torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(3)
    ]  # (b, h, n, d)


def make_lsh(n: int):
    """Zero-argument callable: LSH attention (shared queries and keys) of length n."""
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
    q, k, v = _inputs(n)
    proj = linformer_projection(n, RANK, generator=torch.Generator().manual_seed(1))
    return lambda: linformer_attention(
        q, k, v, key_projection=proj, value_projection=proj
    )


def make_sdpa(n: int):
    """Zero-argument callable: PyTorch's fused exact attention of length n."""
    q, k, v = _inputs(n)
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)


def main() -> None:
    run = begin("approximate")
    torch.set_num_threads(THREADS)
    sizes = QUICK_SIZES if run.quick else SIZES
    sdpa_max = sizes[-1] if run.quick else SDPA_MAX
    makers = {"lsh": make_lsh, "linformer": make_linformer, "sdpa": make_sdpa}
    result = sweep(run, sizes, makers, upto={"sdpa": sdpa_max}, memory=True, warmup=1)
    config = protocol_config(
        run,
        batch=1,
        heads=HEADS,
        d=DIM,
        dtype="float32",
        lsh_num_buckets=BUCKETS,
        lsh_num_hashes=HASHES,
        lsh_chunk_size=CHUNK,
        linformer_k=RANK,
        sdpa_max_n=sdpa_max,
    )
    finish(
        run,
        {
            "config": config,
            "n": sizes,
            **result,
            "slope_time": fit_slope(sizes, result["time_s"], start=2048),
            "slope_memory": fit_slope(
                sizes, result["peak_mib"], start=2048, floor=1e-3
            ),
            "local_slope_time": local_slopes(sizes, result["time_s"], start=2048),
        },
    )


if __name__ == "__main__":
    main()
