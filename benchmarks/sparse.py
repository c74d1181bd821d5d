"""Sparse attention that is efficient, not simulated (chapter 13).

1. Sliding window (window 128, ``|p - k| <= 128``): ``attention.sliding_window_attention``
   against three forms of PyTorch's fused ``scaled_dot_product_attention``, N = 1024 ...
   32768: time, peak memory, their ratios, and the log-log slopes of the windowed time and
   memory from N = 2048 on (1 = linear):

   * ``dense``: fused SDPA without a mask (the whole N x N problem; the strongest baseline
     in time: it does more work but in one fused call), N <= 16384;
   * ``dense_mask``: fused SDPA given the boolean ``sliding_window_mask`` (built once,
     outside the timed loop), as a user calls it: SDPA turns the boolean mask into an
     additive float mask on every call (4 N^2 bytes), N <= 8192;
   * ``dense_prepared_mask``: fused SDPA given that additive float mask (0 / -inf)
     prepared once outside the timed loop, so the call pays no conversion, N <= 8192.

   The "density x dense" yardstick of block-sparse attention is reported for the window too:
   window time / (density x dense time), density = kept (query, key) pairs / N^2.
2. Block-sparse (block 256, the sparsest local + global layout of density >= 12 %):
   ``attention.block_sparse_attention`` against the fused dense SDPA without a mask;
   the yardstick is time / (density x dense time). The same with block 128, side by side,
   and the cost of the tiles themselves: a block-diagonal layout (each query block sees
   only its own key block) at N = 4096 for blocks of 64 ... 512, whose ratio is the price
   of cutting the problem into tiles of that size on this CPU.

fp32, batch 1, 4 heads, d = 64, under the protocol of ``_common`` (one thread for time and
for memory, passive OpenMP waiting, contenders interleaved, >= 7 repeats after warm-up,
median and quartiles saved); peak memory of one call in a fresh subprocess.

Keys (``sliding_window``): ``n``, ``window_s``, ``dense_mask_s``, ``speedup`` (dense_mask /
window), ``window_mib``, ``dense_mask_mib``, ``memory_ratio`` (dense_mask / window memory),
``slope_time``, ``slope_memory`` (now fitted over N = 2048 ... 32768), as before; added:
``dense_s``, ``dense_prepared_mask_s`` (``None`` where not run), ``*_s_q1`` / ``*_s_q3``
beside every ``*_s`` (interquartile range), ``dense_mib``, ``dense_prepared_mask_mib``,
``speedup_vs_dense``, ``speedup_vs_prepared_mask`` (baseline / window, medians) and
``*_separated`` beside each speed-up (the two interquartile ranges do not overlap),
``density`` (kept pairs / N^2), ``ratio_to_density_x_dense`` (window / (density x dense)),
``mask_float_mib`` (size of the float mask SDPA builds from the boolean one),
``slope_n`` (the sizes of the fit), ``local_slope_time``, ``local_slope_memory`` (slope
between neighbouring sizes from 2048 on). ``block_sparse``: as before, plus
``block_sparse_s_q1``, ``block_sparse_s_q3``, ``dense_s_q1``, ``dense_s_q3``,
``small_block_s_q1``, ``small_block_s_q3``. ``block_diagonal``: as before.
``one_thread_check``: kept for the chapters; every timing is now one thread, so it copies
the N = 8192 values of the main run. Plus ``stamp`` and ``quiet`` (see ``_common``).

Why the old "15x less memory" at N = 1024 was an artefact: that result's probe did not fix
glibc's mmap threshold, which grows after the warm-up call frees a large buffer; the
measured call then reused the freed 4 MiB float mask (still resident) and seemed to need
1.1 MiB, less than the mask it converts. ``_common.peak_memory_mib`` fixes
``MALLOC_MMAP_THRESHOLD_``; ``mask_float_mib`` is saved so a reader can check that the
dense + mask peak includes it.

Run with ``.venv/bin/python benchmarks/sparse.py`` (about two and a half minutes on a quiet
machine; fused SDPA at N = 16384 takes about 3 s of CPU a call);
results go to ``src/attention/benchmark_results/sparse.json``.
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
    separated,
)

# Block 256. GPU block-sparse kernels use 16-128 (BigBird 64) because a GPU's tile is that
# size; PyTorch's fused CPU kernel cuts its queries into chunks of 32 rows for a call of
# fewer than 192 queries and of 64 or 256 rows for longer ones, so in a 128-row tile a
# score costs it more than in the dense problem (the block-diagonal rows below measure
# this). Density at N = 2048 / 4096 / 8192: 0.34 (8 blocks a side: the global row and
# column alone keep 15 of the 64 tiles, the diagonal 7 more) / 0.18 / 0.15; block 128
# gives 0.18 / 0.15 / 0.14.
HEADS, D, WINDOW, BLOCK, SMALL_BLOCK = 4, 64, 128, 256, 128
SIZES = [1024, 2048, 4096, 8192, 16384, 32768]
DENSE_MAX = (
    16384  # fused SDPA without a mask: 11 s a call at 32768 on one thread, skipped
)
DENSE_MASK_MAX = 8192  # the masked dense calls need an N x N mask; skipped above this
SLOPE_FROM = 2048
BLOCK_SIZES = [2048, 4096, 8192]
TILE_N, TILE_BLOCKS = 4096, [64, 128, 256, 512]
QUICK = {
    "sizes": [1024, 2048],
    "dense_max": 2048,
    "mask_max": 2048,
    "block_sizes": [2048],
    "tile_n": 2048,
    "tile_blocks": [128, 256],
}


def _inputs(n: int):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, HEADS, n, D, generator=g) for _ in range(3)]


def layout_for(n: int, block: int = BLOCK):
    """The sparsest local + global block layout (one global block) with density >= 12 %."""
    from attention import local_global_layout

    nb = n // block
    for w in range(nb):
        layout = local_global_layout(nb, w, 1)
        if layout.float().mean() >= 0.12:
            return layout
    return layout


# ---- zero-argument callables for the memory probe (built in the subprocess) ------------


def window_call(n: int):
    from attention import sliding_window_attention

    q, k, v = _inputs(n)
    return lambda: sliding_window_attention(q, k, v, window=WINDOW)


def dense_mask_call(n: int):
    from attention import sliding_window_mask

    q, k, v = _inputs(n)
    mask = sliding_window_mask(n, WINDOW)
    return lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask
    )


def prepared_mask_call(n: int):
    """Fused SDPA with the additive float mask (0 where allowed, -inf elsewhere), made once."""
    from attention import sliding_window_mask

    q, k, v = _inputs(n)
    allowed = sliding_window_mask(n, WINDOW)
    mask = torch.zeros(n, n).masked_fill_(~allowed, float("-inf"))
    return lambda: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask
    )


def window_density(n: int) -> float:
    """Kept (query, key) pairs of the window mask over N^2 (counted on the mask up to 8192;
    beyond, every added row is an interior row, with the interior row's count)."""
    from attention import sliding_window_mask

    m = min(n, 8192)
    mask = sliding_window_mask(m, WINDOW)
    pairs = int(mask.sum()) + (n - m) * int(mask[m // 2].sum())
    return pairs / n**2


def block_sparse_call(n: int, block: int = BLOCK):
    from attention import block_sparse_attention

    q, k, v = _inputs(n)
    layout = layout_for(n, block)
    return lambda: block_sparse_attention(q, k, v, layout=layout, block_size=block)


def block_diagonal_call(n: int, block: int):
    from attention import block_sparse_attention

    q, k, v = _inputs(n)
    layout = torch.eye(n // block, dtype=torch.bool)
    return lambda: block_sparse_attention(q, k, v, layout=layout, block_size=block)


def dense_call(n: int):
    q, k, v = _inputs(n)
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)


def peak_mib(fn: str, **kwargs) -> float:
    """Extra peak resident memory (MiB) of one call of ``fn(**kwargs)()``, in a fresh subprocess
    (the shared probe of ``_common``, one thread)."""
    return peak_memory_mib(f"sparse:{fn}", **kwargs)


def _q(stats: dict | None, key: str):
    return None if stats is None else stats[key]


def sliding_window(sizes, dense_max, mask_max, repeat) -> dict:
    names = ("window", "dense", "dense_mask", "dense_prepared_mask")
    calls = {
        "window": window_call,
        "dense": dense_call,
        "dense_mask": dense_mask_call,
        "dense_prepared_mask": prepared_mask_call,
    }
    sw = {
        "n": sizes,
        **{
            f"{m}{suffix}": []
            for m in names
            for suffix in ("_s", "_s_q1", "_s_q3", "_mib")
        },
        "speedup": [],
        "speedup_separated": [],
        "speedup_vs_dense": [],
        "speedup_vs_dense_separated": [],
        "speedup_vs_prepared_mask": [],
        "speedup_vs_prepared_mask_separated": [],
        "memory_ratio": [],
        "density": [],
        "ratio_to_density_x_dense": [],
        "mask_float_mib": [],
    }
    for n in sizes:
        run_now = [
            m
            for m in names
            if m == "window"
            or (m == "dense" and n <= dense_max)
            or (m != "dense" and n <= mask_max)
        ]
        t = interleaved_stats(
            {m: calls[m](n) for m in run_now}, warmup=1, repeat=repeat
        )
        density = window_density(n)
        sw["density"].append(density)
        sw["mask_float_mib"].append(4 * n * n / 2**20)
        for m in names:
            st = t.get(m)
            sw[f"{m}_s"].append(_q(st, "median"))
            sw[f"{m}_s_q1"].append(_q(st, "q1"))
            sw[f"{m}_s_q3"].append(_q(st, "q3"))
            sw[f"{m}_mib"].append(
                peak_mib(
                    f"{m}_call" if m != "dense_prepared_mask" else "prepared_mask_call",
                    n=n,
                )
                if st is not None
                else None
            )
        w = t["window"]
        for key, base in (
            ("speedup", "dense_mask"),
            ("speedup_vs_dense", "dense"),
            ("speedup_vs_prepared_mask", "dense_prepared_mask"),
        ):
            sw[key].append(t[base]["median"] / w["median"] if base in t else None)
            sw[f"{key}_separated"].append(separated(t[base], w) if base in t else None)
        sw["memory_ratio"].append(
            sw["dense_mask_mib"][-1] / max(sw["window_mib"][-1], 1e-9)
            if sw["dense_mask_mib"][-1] is not None
            else None
        )
        sw["ratio_to_density_x_dense"].append(
            w["median"] / (density * t["dense"]["median"]) if "dense" in t else None
        )
        print(
            f"sliding window N={n:6d}: window {w['median']:.4f} s ({sw['window_mib'][-1]:.1f} MiB); "
            + "; ".join(
                f"{m} {t[m]['median']:.4f} s ({sw[f'{m}_mib'][-1]:.1f} MiB)"
                for m in run_now[1:]
            ),
            flush=True,
        )
    fit = [i for i, n in enumerate(sizes) if n >= SLOPE_FROM]
    fit = fit if len(fit) >= 2 else list(range(len(sizes)))
    ns = [sizes[i] for i in fit]
    sw["slope_n"] = ns
    sw["slope_time"] = log_slope(ns, [sw["window_s"][i] for i in fit])
    sw["slope_memory"] = log_slope(ns, [max(sw["window_mib"][i], 1e-3) for i in fit])
    sw["local_slope_time"] = [
        log_slope(ns[k : k + 2], [sw["window_s"][i] for i in fit[k : k + 2]])
        for k in range(len(fit) - 1)
    ]
    sw["local_slope_memory"] = [
        log_slope(
            ns[k : k + 2], [max(sw["window_mib"][i], 1e-3) for i in fit[k : k + 2]]
        )
        for k in range(len(fit) - 1)
    ]
    print(
        f"sliding window log-log slopes, N = {ns[0]}-{ns[-1]}: time {sw['slope_time']:.2f} "
        f"(local {', '.join(f'{x:.2f}' for x in sw['local_slope_time'])}), memory "
        f"{sw['slope_memory']:.2f} (local {', '.join(f'{x:.2f}' for x in sw['local_slope_memory'])})"
    )
    return sw


def block_sparse(block_sizes, quick) -> dict:
    bs = {
        "n": block_sizes,
        "block_size": BLOCK,
        "density": [],
        "block_sparse_s": [],
        "block_sparse_s_q1": [],
        "block_sparse_s_q3": [],
        "dense_s": [],
        "dense_s_q1": [],
        "dense_s_q3": [],
        "ratio_to_density_x_dense": [],
        "block_sparse_mib": [],
        "dense_mib": [],
        "small_block_size": SMALL_BLOCK,
        "small_block_density": [],
        "small_block_s": [],
        "small_block_s_q1": [],
        "small_block_s_q3": [],
        "small_block_ratio": [],
    }
    for n in block_sizes:
        density = float(layout_for(n).float().mean())
        small_density = float(layout_for(n, SMALL_BLOCK).float().mean())
        # Calls of 10-100 ms are cheap to repeat; many samples steady the medians.
        t = interleaved_stats(
            {
                "block_sparse": block_sparse_call(n),
                "dense": dense_call(n),
                "small": block_sparse_call(n, SMALL_BLOCK),
            },
            warmup=1 if quick else 3,
            repeat=3 if quick else max(MIN_REPEAT, {2048: 41, 4096: 21}.get(n, 9)),
        )
        ratio = t["block_sparse"]["median"] / (density * t["dense"]["median"])
        small_ratio = t["small"]["median"] / (small_density * t["dense"]["median"])
        bs["density"].append(density)
        for key, name in (
            ("block_sparse", "block_sparse"),
            ("dense", "dense"),
            ("small_block", "small"),
        ):
            bs[f"{key}_s"].append(t[name]["median"])
            bs[f"{key}_s_q1"].append(t[name]["q1"])
            bs[f"{key}_s_q3"].append(t[name]["q3"])
        bs["ratio_to_density_x_dense"].append(ratio)
        bs["small_block_density"].append(small_density)
        bs["small_block_ratio"].append(small_ratio)
        bs["block_sparse_mib"].append(peak_mib("block_sparse_call", n=n))
        bs["dense_mib"].append(peak_mib("dense_call", n=n))
        print(
            f"block-sparse N={n:5d}, block {BLOCK}: density {density:.3f}, "
            f"block-sparse {t['block_sparse']['median']:.4f} s, dense {t['dense']['median']:.4f} s, "
            f"time / (density x dense) = {ratio:.2f}; block {SMALL_BLOCK}: "
            f"density {small_density:.3f}, ratio {small_ratio:.2f}",
            flush=True,
        )
    return bs


def main() -> None:
    run = begin("sparse")
    q = (
        QUICK
        if run.quick
        else {
            "sizes": SIZES,
            "dense_max": DENSE_MAX,
            "mask_max": DENSE_MASK_MAX,
            "block_sizes": BLOCK_SIZES,
            "tile_n": TILE_N,
            "tile_blocks": TILE_BLOCKS,
        }
    )
    repeat = 3 if run.quick else MIN_REPEAT
    torch.set_num_threads(THREADS)
    sw = sliding_window(q["sizes"], q["dense_max"], q["mask_max"], repeat)
    bs = block_sparse(q["block_sizes"], run.quick)

    # What the tiles cost: each query block sees only its own key block, so the kept work
    # is exactly n * B per head and the ratio is the price of cutting the problem into
    # B x B tiles (1 would mean tiles as cheap per score as the dense call).
    n, blocks = q["tile_n"], q["tile_blocks"]
    calls = {"dense": dense_call(n), **{B: block_diagonal_call(n, B) for B in blocks}}
    t = interleaved_stats(
        calls, warmup=1 if run.quick else 3, repeat=3 if run.quick else 21
    )
    tiles = {
        "n": n,
        "block_size": blocks,
        "ratio_to_density_x_dense": [
            t[B]["median"] / (B / n * t["dense"]["median"]) for B in blocks
        ],
    }
    print(
        f"block-diagonal layouts at N={n}, time / (density x dense): "
        + ", ".join(
            f"block {B}: {r:.2f}"
            for B, r in zip(blocks, tiles["ratio_to_density_x_dense"], strict=True)
        )
    )

    # Every timing above is one thread: the old separate one-thread check is the N = 8192 row.
    n = 8192 if 8192 in sw["n"] and 8192 in bs["n"] else sw["n"][-1]
    i, k = sw["n"].index(n), (bs["n"].index(n) if n in bs["n"] else -1)
    one = {
        "n": n,
        "threads": THREADS,
        "window_s": sw["window_s"][i],
        "dense_mask_s": sw["dense_mask_s"][i],
        "block_sparse_s": bs["block_sparse_s"][k],
        "dense_s": bs["dense_s"][k],
        "window_speedup": sw["speedup"][i],
        "block_sparse_ratio_to_density_x_dense": bs["ratio_to_density_x_dense"][k],
        "note": "copied from the main run, which is one thread throughout",
    }

    finish(
        run,
        {
            "config": {
                "dtype": "float32",
                "batch": 1,
                "heads": HEADS,
                "d": D,
                "window": WINDOW,
                "window_keys_per_interior_query": round(
                    window_density(8192) * 8192**2 - window_density(4096) * 4096**2
                )
                // 4096,
                "block_size": BLOCK,
                "small_block_size": SMALL_BLOCK,
                "dense_max_n": q["dense_max"],
                "dense_mask_max_n": q["mask_max"],
                "threads": THREADS,
                "omp_wait_policy": OMP_WAIT_POLICY,
                "repeat": repeat,
            },
            "sliding_window": sw,
            "block_sparse": bs,
            "block_diagonal": tiles,
            "one_thread_check": one,
        },
        repeat=repeat,
    )


if __name__ == "__main__":
    main()
