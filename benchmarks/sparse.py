"""Sparse attention that is efficient, not simulated (chapter 13).

1. Sliding window (window 128, ``|p - k| <= 128``):
   ``attention.sliding_window_attention`` against three forms of PyTorch's fused
   ``scaled_dot_product_attention``, N = 1024 ... 32768: time, peak memory, their
   ratios, and the log-log slopes of the windowed time and memory from N = 2048 on (1 =
   linear):

   * ``dense``: fused SDPA without a mask (the whole N x N problem; the strongest
     baseline in time: it does more work but in one fused call), N <= 16384;
   * ``dense_mask``: fused SDPA given the boolean ``sliding_window_mask`` (built once,
     outside the timed loop), as a user calls it: SDPA turns the boolean mask into an
     additive float mask on every call (4 N^2 bytes), N <= 8192;
   * ``dense_prepared_mask``: fused SDPA given that additive float mask (0 / -inf)
     prepared once outside the timed loop, so the call pays no conversion, N <= 8192.

   The "density x dense" yardstick of block-sparse attention is reported for the window
   too: window time / (density x dense time), density = kept (query, key) pairs / N^2.
2. Block-sparse (block 256, the sparsest local + global layout of density >= 12 %):
   ``attention.block_sparse_attention`` against the fused dense SDPA without a mask; the
   yardstick is time / (density x dense time). The same with block 128, side by side,
   and the cost of the tiles themselves: a block-diagonal layout (each query block sees
   only its own key block) at N = 4096 for blocks of 64 ... 512, whose ratio is the
   price of cutting the problem into tiles of that size on this CPU.

fp32, batch 1, 4 heads, d = 64, under the protocol of ``_common`` (one thread for time
and for memory, passive OpenMP waiting, contenders interleaved, >= 7 repeats after
warm-up, median and quartiles saved); peak memory of one call in a fresh subprocess.

Keys (``sliding_window``): ``n``, ``window_s``, ``dense_mask_s``, ``speedup``
(dense_mask / window), ``window_mib``, ``dense_mask_mib``, ``memory_ratio`` (dense_mask
/ window memory), ``slope_time``, ``slope_memory`` (now fitted over N = 2048 ... 32768),
as before; added: ``dense_s``, ``dense_prepared_mask_s`` (``None`` where not run),
``*_s_q1`` / ``*_s_q3`` beside every ``*_s`` (interquartile range), ``dense_mib``,
``dense_prepared_mask_mib``, ``speedup_vs_dense``, ``speedup_vs_prepared_mask``
(baseline / window, medians) and ``*_separated`` beside each speed-up (the two
interquartile ranges do not overlap), ``density`` (kept pairs / N^2),
``ratio_to_density_x_dense`` (window / (density x dense)), ``mask_float_mib`` (size of
the float mask SDPA builds from the boolean one), ``slope_n`` (the sizes of the fit),
``local_slope_time``, ``local_slope_memory`` (slope between neighbouring sizes from 2048
on). ``block_sparse``: as before, plus ``block_sparse_s_q1``, ``block_sparse_s_q3``,
``dense_s_q1``, ``dense_s_q3``, ``small_block_s_q1``, ``small_block_s_q3``.
``block_diagonal``: as before. ``one_thread_check``: kept for the chapters; every timing
is now one thread, so it copies the N = 8192 values of the main run. Plus ``stamp`` and
``quiet`` (see ``_common``).

Why the old "15x less memory" at N = 1024 was an artefact: that result's probe did not
fix glibc's mmap threshold, which grows after the warm-up call frees a large buffer; the
measured call then reused the freed 4 MiB float mask (still resident) and seemed to need
1.1 MiB, less than the mask it converts. ``_common.peak_memory_mib`` fixes
``MALLOC_MMAP_THRESHOLD_``; ``mask_float_mib`` is saved so a reader can check that the
dense + mask peak includes it.

Run with ``.venv/bin/python benchmarks/sparse.py`` (about two and a half minutes on a
quiet machine; fused SDPA at N = 16384 takes about 3 s of CPU a call); results go to
``src/attention/benchmark_results/sparse.json``.
"""

from __future__ import annotations

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads

import torch
from _common import (
    MIN_REPEAT,
    THREADS,
    begin,
    finish,
    fit_slope,
    interleaved_stats,
    local_slopes,
    protocol_config,
    ratio,
    separated_at,
    sweep,
)

from attention import (
    block_sparse_attention,
    local_global_layout,
    sliding_window_attention,
    sliding_window_mask,
)

ORDER = 50  # place in run_all.py's session
# Block 256. GPU block-sparse kernels use 16-128 (BigBird 64) because a GPU's tile is
# that size; PyTorch's fused CPU kernel cuts its queries into chunks of 32 rows for a
# call of fewer than 192 queries and of 64 or 256 rows for longer ones, so in a 128-row
# tile a score costs it more than in the dense problem (the block-diagonal rows below
# measure this). Density at N = 2048 / 4096 / 8192: 0.34 (8 blocks a side: the global
# row and column alone keep 15 of the 64 tiles, the diagonal 7 more) / 0.18 / 0.15;
# block 128 gives 0.18 / 0.15 / 0.14.
HEADS, D, WINDOW, BLOCK, SMALL_BLOCK = 4, 64, 128, 256, 128
SLOPE_FROM = 2048
FULL = {
    "sizes": [1024, 2048, 4096, 8192, 16384, 32768],
    "dense_max": 16384,  # fused SDPA without a mask: 11 s a call at 32768, skipped
    "mask_max": 8192,  # the masked dense calls need an N x N mask; skipped above this
    "block_sizes": [2048, 4096, 8192],
    "tile_n": 4096,
    "tile_blocks": [64, 128, 256, 512],
}
QUICK = {
    "sizes": [256, 512],
    "dense_max": 512,
    "mask_max": 512,
    "block_sizes": [1024],
    "tile_n": 512,
    "tile_blocks": [128, 256],
}


def _inputs(n: int):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, HEADS, n, D, generator=g) for _ in range(3)]


def layout_for(n: int, block: int = BLOCK):
    """The sparsest local + global block layout (one global block) with density >=
    12 %."""
    nb = n // block
    for w in range(nb):
        layout = local_global_layout(nb, w, 1)
        if layout.float().mean() >= 0.12:
            return layout
    return local_global_layout(nb, nb - 1, 1)


# ---- zero-argument callables for the memory probe (built in the subprocess) ----------


def window_call(n: int):
    q, k, v = _inputs(n)
    return lambda: sliding_window_attention(q, k, v, window=WINDOW)


def dense_mask_call(n: int):
    q, k, v = _inputs(n)
    mask = sliding_window_mask(n, WINDOW)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v, attn_mask=mask)


def prepared_mask_call(n: int):
    """Fused SDPA with the additive float mask (0 where allowed, -inf elsewhere), made
    once."""
    q, k, v = _inputs(n)
    allowed = sliding_window_mask(n, WINDOW)
    mask = torch.zeros(n, n).masked_fill_(~allowed, float("-inf"))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v, attn_mask=mask)


def block_sparse_call(n: int, block: int = BLOCK):
    q, k, v = _inputs(n)
    layout = layout_for(n, block)
    return lambda: block_sparse_attention(q, k, v, layout=layout, block_size=block)


def small_block_call(n: int):
    return block_sparse_call(n, SMALL_BLOCK)


def block_diagonal_call(n: int, block: int):
    q, k, v = _inputs(n)
    layout = torch.eye(n // block, dtype=torch.bool)
    return lambda: block_sparse_attention(q, k, v, layout=layout, block_size=block)


def dense_call(n: int):
    q, k, v = _inputs(n)
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)


def window_density(n: int) -> float:
    """Kept (query, key) pairs of the window mask over N^2 (counted on the mask up to
    8192; beyond, every added row is an interior row, with the interior row's count)."""
    m = min(n, 8192)
    mask = sliding_window_mask(m, WINDOW)
    pairs = int(mask.sum()) + (n - m) * int(mask[m // 2].sum())
    return pairs / n**2


def sliding_window(run, q: dict) -> dict:
    sizes = q["sizes"]
    makers = {
        "window": window_call,
        "dense": dense_call,
        "dense_mask": dense_mask_call,
        "dense_prepared_mask": prepared_mask_call,
    }
    upto = {"dense": q["dense_max"], "dense_mask": q["mask_max"]}
    upto["dense_prepared_mask"] = q["mask_max"]
    res = sweep(run, sizes, makers, upto=upto, memory=True, warmup=1)
    sw = {"n": sizes}
    for m in makers:
        for suffix in ("", "_q1", "_q3"):
            sw[f"{m}_s{suffix}"] = res[f"time_s{suffix}"][m]
        sw[f"{m}_mib"] = res["peak_mib"][m]
    for key, base in (
        ("speedup", "dense_mask"),
        ("speedup_vs_dense", "dense"),
        ("speedup_vs_prepared_mask", "dense_prepared_mask"),
    ):
        sw[key] = ratio(res, base, "window")
        sw[f"{key}_separated"] = separated_at(res, base, "window")
    sw["memory_ratio"] = ratio(res, "dense_mask", "window", key="peak_mib")
    sw["density"] = [window_density(n) for n in sizes]
    sw["ratio_to_density_x_dense"] = [
        None if dense is None else w / (rho * dense)
        for w, rho, dense in zip(sw["window_s"], sw["density"], sw["dense_s"])
    ]
    sw["mask_float_mib"] = [4 * n * n / 2**20 for n in sizes]
    memory = [max(m, 1e-3) for m in sw["window_mib"]]
    fitted = [n for n in sizes if n >= SLOPE_FROM]
    sw["slope_n"] = fitted if len(fitted) >= 2 else sizes
    for key, ys in (("time", sw["window_s"]), ("memory", memory)):
        sw[f"slope_{key}"] = fit_slope(sizes, ys, start=SLOPE_FROM)
        sw[f"local_slope_{key}"] = local_slopes(sizes, ys, start=SLOPE_FROM)
    return sw


def block_sparse(run, q: dict) -> dict:
    sizes = q["block_sizes"]
    makers = {"block_sparse": block_sparse_call, "dense": dense_call}
    makers["small"] = small_block_call

    def repeat(n: int) -> int:
        # Calls of 10-100 ms are cheap to repeat; many samples steady the medians.
        return (
            run.repeat if run.quick else max(MIN_REPEAT, {2048: 41, 4096: 21}.get(n, 9))
        )

    warmup = 1 if run.quick else 3
    probed = ("block_sparse", "dense")
    res = sweep(run, sizes, makers, memory=probed, warmup=warmup, repeat=repeat)
    density = [float(layout_for(n).float().mean()) for n in sizes]
    small = [float(layout_for(n, SMALL_BLOCK).float().mean()) for n in sizes]
    bs = {"n": sizes, "block_size": BLOCK, "density": density}
    for key, name in (("block_sparse", "block_sparse"), ("dense", "dense")):
        for suffix in ("", "_q1", "_q3"):
            bs[f"{key}_s{suffix}"] = res[f"time_s{suffix}"][name]
        bs[f"{key}_mib"] = res["peak_mib"][name]
    bs["ratio_to_density_x_dense"] = [
        b / (rho * d) for b, rho, d in zip(bs["block_sparse_s"], density, bs["dense_s"])
    ]
    bs |= {"small_block_size": SMALL_BLOCK, "small_block_density": small}
    for suffix in ("", "_q1", "_q3"):
        bs[f"small_block_s{suffix}"] = res[f"time_s{suffix}"]["small"]
    bs["small_block_ratio"] = [
        t / (rho * d) for t, rho, d in zip(bs["small_block_s"], small, bs["dense_s"])
    ]
    return bs


def block_diagonal(run, q: dict) -> dict:
    """What the tiles cost: each query block sees only its own key block, so the kept
    work is exactly n * B per head and the ratio is the price of cutting the problem
    into B x B tiles (1 would mean tiles as cheap per score as the dense call)."""
    n, blocks = q["tile_n"], q["tile_blocks"]
    calls = {"dense": dense_call(n), **{B: block_diagonal_call(n, B) for B in blocks}}
    t = interleaved_stats(
        calls, warmup=1 if run.quick else 3, repeat=run.repeat if run.quick else 21
    )
    dense = t["dense"]["median"]
    tiles = [t[B]["median"] / (B / n * dense) for B in blocks]
    print(f"block-diagonal at N = {n}, time / (density x dense): {tiles}")
    return {"n": n, "block_size": blocks, "ratio_to_density_x_dense": tiles}


def main() -> None:
    run = begin("sparse")
    torch.set_num_threads(THREADS)
    q = QUICK if run.quick else FULL
    sw, bs, tiles = sliding_window(run, q), block_sparse(run, q), block_diagonal(run, q)
    # Every timing above is one thread: the old one-thread check is the N = 8192 row.
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
    interior = window_density(8192) * 8192**2 - window_density(4096) * 4096**2
    config = protocol_config(
        run,
        dtype="float32",
        batch=1,
        heads=HEADS,
        d=D,
        window=WINDOW,
        window_keys_per_interior_query=round(interior) // 4096,
        block_size=BLOCK,
        small_block_size=SMALL_BLOCK,
        dense_max_n=q["dense_max"],
        dense_mask_max_n=q["mask_max"],
    )
    finish(
        run,
        {
            "config": config,
            "sliding_window": sw,
            "block_sparse": bs,
            "block_diagonal": tiles,
            "one_thread_check": one,
        },
    )


if __name__ == "__main__":
    main()
