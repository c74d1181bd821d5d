"""Run every benchmark in one session, in a fixed order, and print the time each took.

All results then come from one machine in one sitting, under the one protocol of
``_common`` (one thread for time and memory, passive OpenMP waiting, >= 7 interleaved
repeats, load checked before and after). Options are passed on to every script:
``--allow-loaded`` (save on a loaded machine, marked ``"quiet": false``), ``--out DIR``,
``--quick`` (tiny sizes, saved to a temporary folder: a smoke test). A script that refuses
(a loaded machine) or fails is reported and the others still run; the exit status is then 1.
Each script after the first is told (``BENCH_LOAD_ALLOWANCE=1``) that one busy thread in
the load average it reads at its start is the previous benchmark's.

Run: ``.venv/bin/python benchmarks/run_all.py``, or ``--only a,b`` to run some of them,
still in the fixed order. Expected on a quiet 2-core AMD EPYC (estimated from the CPU time
of the largest calls, one thread): mha ~1.5 min, linear ~1, tiled ~2, tiled_backward ~2.5,
sparse ~2.5, approximate ~1, learned_sparse ~4,
alignment ~0.3, paged ~0.2, decode ~0.7, recurrent ~1, ring ~2.5: about 19
minutes in all. ``--quick`` (smoke sizes) took 6.5 minutes on the same machine at load 6-10,
most of it the start-up of the memory probes' fresh processes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Fixed order: the quick single-process scripts first, the ring's process launches last.
ORDER = [
    "mha",
    "linear",
    "tiled",
    "tiled_backward",
    "sparse",
    "approximate",
    "learned_sparse",
    "alignment",
    "paged",
    "decode",
    "recurrent",
    "ring",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allow-loaded", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--only", default=None, help="comma-separated names, e.g. sparse,linear"
    )
    args = parser.parse_args()
    names = (
        ORDER if args.only is None else [n for n in ORDER if n in args.only.split(",")]
    )
    unknown = set() if args.only is None else set(args.only.split(",")) - set(ORDER)
    if unknown:
        parser.error(
            f"unknown benchmark(s) {sorted(unknown)}; known: {', '.join(ORDER)}"
        )
    extra = (["--allow-loaded"] if args.allow_loaded else []) + (
        ["--quick"] if args.quick else []
    )
    if args.out is not None:
        extra += ["--out", str(args.out)]
    took, status = {}, {}
    start = time.perf_counter()
    env = os.environ.copy()
    for k, name in enumerate(names):
        print(f"\n=== {name} ===", flush=True)
        # After the first script, its one busy thread is still in the 1-minute load average.
        env["BENCH_LOAD_ALLOWANCE"] = "0" if k == 0 else "1"
        t0 = time.perf_counter()
        rc = subprocess.run(
            [sys.executable, str(HERE / f"{name}.py"), *extra], env=env
        ).returncode
        took[name] = time.perf_counter() - t0
        status[name] = {0: "saved", 3: "refused (loaded machine)"}.get(
            rc, f"failed (exit {rc})"
        )
    total = time.perf_counter() - start
    print("\n=== summary ===")
    for name in names:
        print(f"{name:<16}{took[name]:8.0f} s   {status[name]}")
    print(f"{'total':<16}{total:8.0f} s   ({total / 60:.1f} min)")
    return 0 if all(s == "saved" for s in status.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
