"""Run every benchmark in one session, in a fixed order, and print the time each took.

The scripts are found, not listed: every ``benchmarks/<name>.py`` except ``_common.py``
and this one, run in the order of the ``ORDER = <number>`` each declares at module
level (read from its source, without importing it; ``--list`` prints it). The quick
single-process scripts come first, the ring's process launches last but one (its four
busy ranks linger in the next script's 1-minute load average), and the Triton kernel
last (it needs a CUDA device, and says so where there is none).

All results then come from one machine in one sitting, under the one protocol of
``_common`` (one thread for time and memory, passive OpenMP waiting, >= 7 interleaved
repeats, load checked before and after). Options are passed on to every script:
``--allow-loaded`` (save on a loaded machine, marked ``"quiet": false``), ``--out DIR``,
``--quick`` (tiny sizes, saved to a temporary folder: a smoke test). A script that
refuses (a loaded machine) or fails is reported and the others still run; the exit
status is then 1. A script that exits with status 4 (no device for it here) is reported
as skipped. Each script after the first is told (``BENCH_LOAD_ALLOWANCE=1``) that one
busy thread in the load average it reads at its start is the previous benchmark's.

Run: ``.venv/bin/python benchmarks/run_all.py``, or ``--only a,b`` to run some of them,
still in the fixed order. Expected on a quiet 2-core AMD EPYC (estimated from the CPU
time of the largest calls, one thread): mha ~1.5 min, linear ~1, tiled ~2,
tiled_backward ~2.5, sparse ~2.5, approximate ~1, learned_sparse ~4, alignment ~0.3,
paged ~0.2, decode ~0.7, recurrent ~1, ring ~2.5: about 19 minutes in all.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def declared_order(path: Path) -> float:
    """The ``ORDER = <number>`` a script declares at module level."""
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["ORDER"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, int | float)
        ):
            return node.value.value
    raise ValueError(f"{path.name} declares no module-level ORDER = <number>")


def discover() -> list[str]:
    """Every benchmark script's name, in the order the scripts declare."""
    paths = [p for p in HERE.glob("*.py") if not p.stem.startswith("_")]
    paths = [p for p in paths if p.name != Path(__file__).name]
    return [p.stem for p in sorted(paths, key=lambda p: (declared_order(p), p.stem))]


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--allow-loaded", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--only", default=None, help="comma-separated names, e.g. sparse,linear"
    )
    parser.add_argument(
        "--list", action="store_true", help="print the scripts in their order and stop"
    )
    args = parser.parse_args()
    order = discover()
    if args.list:
        print("\n".join(order))
        return 0
    wanted = order if args.only is None else args.only.split(",")
    unknown = set(wanted) - set(order)
    if unknown:
        parser.error(
            f"unknown benchmark(s) {sorted(unknown)}; known: {', '.join(order)}"
        )
    names = [n for n in order if n in wanted]
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
        # After the first script, its one busy thread is still in the 1-minute load.
        env["BENCH_LOAD_ALLOWANCE"] = "0" if k == 0 else "1"
        t0 = time.perf_counter()
        script = [sys.executable, str(HERE / f"{name}.py"), *extra]
        rc = subprocess.run(script, env=env).returncode
        took[name] = time.perf_counter() - t0
        status[name] = {
            0: "saved",
            3: "refused (loaded machine)",
            4: "skipped (no device for it here)",
        }.get(rc, f"failed (exit {rc})")
    total = time.perf_counter() - start
    print("\n=== summary ===")
    for name in names:
        print(f"{name:<16}{took[name]:8.0f} s   {status[name]}")
    print(f"{'total':<16}{total:8.0f} s   ({total / 60:.1f} min)")
    fine = all(s == "saved" or s.startswith("skipped") for s in status.values())
    return 0 if fine else 1


if __name__ == "__main__":
    raise SystemExit(main())
