"""Ring attention on P = 1, 2, 4 local processes: time and memory per rank (chapter 15).

One causal attention layer's forward and backward pass, fp32, batch 1, 4 heads,
d = e = 64, N = 4096, tiles of 256 keys, sharded over P processes (gloo, one thread
each) with the contiguous and the zigzag layout. On every rank it records

* the extra peak resident memory of one forward + backward (``VmHWM`` after resetting
  it, less the resident size before; glibc returns freed buffers at once, as in
  ``_common.peak_memory_mib``);
* the CPU time of the rank's process during a step (its own arithmetic and
  communication, not the time it waits: robust to a shared machine), and the step's
  wall time (barrier to barrier, the slowest rank).

The machine has 2 cores: P = 4 processes share them, so no speed-up is expected from
P = 4; the point is memory per rank and the balance of causal work. Runs for P = 1, 2, 4
are interleaved (P = 1, 2, 4, 1, 2, 4, ...); 3 launches x 3 timed steps give 9 samples
per rank, whose median and quartiles are saved, so a burst of load from other jobs hits
all of them alike. The protocol of ``_common`` (load check, stamp, passive OpenMP
waiting; every rank runs one thread) applies. Saves
``src/attention/benchmark_results/ring.json``.

Keys: ``stamp``, ``load_average`` ([before, after]), ``config``, ``world_sizes``,
``results`` (``{P: {layout: {peak_mib, cpu_s, wall_s}}}``; ``peak_mib`` and ``cpu_s``
per rank, medians), as before; added in each ``results[P][layout]``: ``cpu_s_q1``,
``cpu_s_q3`` (per rank, interquartile range), ``wall_s_q1``, ``wall_s_q3``; and
``quiet`` (see ``_common``).

Run: ``.venv/bin/python benchmarks/ring.py`` (about two minutes on a quiet machine).
"""

from __future__ import annotations

import os
import statistics
import time

from _common import OMP_POLICY, set_omp_wait_policy

set_omp_wait_policy(OMP_POLICY)  # before torch loads; the ranks inherit it
# Return every freed buffer over 64 KiB to the system at once, so peaks are not hidden
# by reused memory (inherited by the spawned ranks).
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")

import torch
import torch.distributed as dist
from _common import begin, finish, omp_wait_policy, quartiles

from attention.efficient.distributed import (
    ring_attention,
    run_distributed,
    shard_sequence,
)

ORDER = 110  # place in run_all.py's session: its ranks' load lingers, so near the end
N, QUICK_N = 4096, 512
HEADS, DIM, BLOCK = 4, 64, 256
WORLD_SIZES, QUICK_WORLD_SIZES = [1, 2, 4], [1, 2]
LAYOUTS = ["contiguous", "zigzag"]
LAUNCHES = 3  # per P, interleaved
TIMED_STEPS = 3  # per launch and layout: 9 samples per rank


def _status_mib(key: str) -> float:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _step(q, k, v, grad_out, layout):
    """One causal layer's forward and backward on this rank's shard."""
    out = ring_attention(q, k, v, is_causal=True, layout=layout, block_size=BLOCK)
    return torch.autograd.grad(out, (q, k, v), grad_out)


def measure(rank: int, world_size: int, n: int) -> list[dict]:
    """Worker: per layout, this rank's peak memory and CPU time of forward + backward;
    all ranks' readings gathered."""
    mine = {}
    for layout in LAYOUTS:
        g = torch.Generator().manual_seed(0)
        # q, k, v and the output's gradient
        full = [torch.randn(1, HEADS, n, DIM, generator=g) for _ in range(4)]
        q, k, v, grad_out = (
            shard_sequence(t, world_size, rank, layout=layout).clone() for t in full
        )
        del full
        args = (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), grad_out)
        _step(*args, layout)  # warm-up
        dist.barrier()
        before = _status_mib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak-resident counter
        _step(*args, layout)
        peak = max(_status_mib("VmHWM") - before, 0.0)
        walls, cpus = [], []
        for _ in range(TIMED_STEPS):
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            _step(*args, layout)
            c1 = time.process_time()
            dist.barrier()
            walls.append(time.perf_counter() - t0)
            cpus.append(c1 - c0)
        mine[layout] = {"peak_mib": peak, "wall_s": walls, "cpu_s": cpus}
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return everyone


def summary(launches: list, p: int, layout: str) -> dict:
    """Medians and quartiles of P ranks' readings over every launch and step."""
    per_rank = [
        [run[r][layout] for run in launches] for r in range(p)
    ]  # [rank][launch]
    cpu = [quartiles([c for x in rank for c in x["cpu_s"]]) for rank in per_rank]
    # a step ends when its slowest rank does
    steps = [(a, s) for a in range(len(launches)) for s in range(TIMED_STEPS)]
    wall = quartiles([max(r[a]["wall_s"][s] for r in per_rank) for a, s in steps])
    return {
        "peak_mib": [statistics.median(x["peak_mib"] for x in r) for r in per_rank],
        "cpu_s": [c["median"] for c in cpu],
        "wall_s": wall["median"],
        "cpu_s_q1": [c["q1"] for c in cpu],
        "cpu_s_q3": [c["q3"] for c in cpu],
        "wall_s_q1": wall["q1"],
        "wall_s_q3": wall["q3"],
    }


def main() -> None:
    run = begin("ring")
    n, world_sizes = (QUICK_N, QUICK_WORLD_SIZES) if run.quick else (N, WORLD_SIZES)
    launches = 1 if run.quick else LAUNCHES
    runs = {p: [] for p in world_sizes}
    for launch in range(launches):
        for p in world_sizes:
            t0 = time.perf_counter()
            runs[p].append(run_distributed(measure, p, n, timeout=900))
            took = time.perf_counter() - t0
            print(f"launch {launch + 1}/{launches}, P = {p}: {took:.0f} s", flush=True)
    results = {str(p): {lay: summary(runs[p], p, lay) for lay in LAYOUTS} for p in runs}
    for p, by_layout in results.items():
        for layout, e in by_layout.items():
            print(
                f"P = {p} {layout:>10}: wall {e['wall_s']:6.2f} s; per rank MiB "
                f"{e['peak_mib']}, CPU s {e['cpu_s']}"
            )
    config = {
        "n": n,
        "batch": 1,
        "heads": HEADS,
        "d": DIM,
        "dtype": "float32",
        "block_size": BLOCK,
        "is_causal": True,
        "backend": "gloo, local CPU processes, 1 thread each",
        "launches_per_p": launches,
        "timed_steps_per_launch": TIMED_STEPS,
        "omp_wait_policy": omp_wait_policy(),
    }
    finish(
        run,
        {
            "load_average": None,  # filled by finish: [before, after]
            "config": config,
            "world_sizes": world_sizes,
            "results": results,
        },
        threads=1,
        repeat=launches * TIMED_STEPS,
        own_load=max(world_sizes),  # up to four busy ranks of its own
    )


if __name__ == "__main__":
    main()
