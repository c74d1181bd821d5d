"""Shared protocol, timing, memory and result-saving helpers for the benchmark scripts.

The protocol every script follows (so a reader can trust and compare the saved numbers):

* **One setting for every contender and every script.** Times are taken with
  :data:`THREADS` intra-op thread(s), memory with :data:`MEMORY_THREADS`, under the OpenMP
  wait policy :data:`OMP_POLICY`; all three are recorded in the stamp. One thread: on a
  small machine shared with other work a multi-threaded call stalls whenever one of its
  threads is descheduled, and a one-thread ratio is a property of the algorithms that
  transfers between machines of different core counts. With one thread OpenMP has no
  worker to keep waiting, so the wait policy hardly matters; ``"passive"`` is recorded so
  that a run with more threads (``BENCH_THREADS``) is still comparable between scripts.
  (A quick check on a busy 2-core machine, fused SDPA, block-sparse, sliding-window and
  linear attention at N = 4096: one-thread times equal within noise under passive and
  default waiting; two-thread times slower than one thread and erratic under either.)
* **Spread, not one median.** Contenders run interleaved (round-robin, so a burst of load
  hits all alike), at least :data:`MIN_REPEAT` timed repeats after warm-up; the median and
  the interquartile range are saved: the quartiles of a median saved under key ``K`` are
  ``K_q1`` and ``K_q3``, beside it and with its layout (``time_s`` -> ``time_s_q1``). A
  ratio is worth quoting where the ranges of its two contenders do not overlap
  (:func:`separated`; scripts save ``*_separated`` flags).
* **A quiet machine, named.** The 1-minute load average is read before and after; a script
  refuses to start or to save when it is above the core count, unless run with
  ``--allow-loaded``, which saves the result with ``"quiet": false``. The benchmark's own
  busy processes are taken off first (``load_own_allowance``: [before, after]; 1 after a
  one-thread script, 4 after the ring's four ranks, 1 before a script that ``run_all.py``
  starts right after another). The stamp names the CPU model, cores, threads, policy,
  torch, Python, date and time and load.

Every script opens the same way, choosing OpenMP's wait policy before torch loads::

    from _common import OMP_POLICY, set_omp_wait_policy

    set_omp_wait_policy(OMP_POLICY)  # must come before `import torch`
    import torch

    from _common import THREADS, begin, finish, interleaved_stats

    def main():
        run = begin("name")           # parses --allow-loaded, --out DIR, --quick; checks load
        torch.set_num_threads(THREADS)
        ...
        finish(run, data)             # stamps, checks load again, saves <out>/name.json

Keys the protocol adds to every result (beside the script's own):

* ``stamp``: ``cpu``, ``cores``, ``threads`` (time), ``memory_threads``, ``omp_wait_policy``,
  ``torch``, ``python``, ``date`` (ISO day, as before), ``datetime`` (UTC, to the minute),
  ``load_average`` (the 1-minute load, [before, after]), ``load_1min_before``,
  ``load_1min_after``, ``load_own_allowance``, ``quiet``, ``repeat`` (timed repeats per
  contender, at least), ``quick`` (true only for smoke runs);
* ``quiet``: true when neither load reading was above the core count.

Options of every script: ``--allow-loaded`` (measure and save on a loaded machine, marked
``"quiet": false``), ``--out DIR`` (save there instead of the package's
``benchmark_results``), ``--quick`` (tiny sizes and few repeats, to check that a script
runs; saves to a temporary folder unless ``--out`` is given, never over the shipped
results).

This module imports torch only inside its functions, so importing it first is safe.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

_POLICIES = ("passive", "active", "default")

#: Intra-op threads of every timed call, in every script.
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
#: Intra-op threads of every memory probe, in every script.
MEMORY_THREADS = 1
#: The OpenMP wait policy of every script (an ``OMP_WAIT_POLICY`` in the environment wins).
OMP_POLICY = "passive"
#: The fewest timed repeats of a contender after warm-up (``--quick`` runs excepted).
MIN_REPEAT = 7


def set_omp_wait_policy(policy: str) -> str:
    """Choose OpenMP's wait policy for this run and its memory probes; returns the one in force.

    ``"passive"``: idle OpenMP threads sleep at once. On a shared machine, with the default
    (spinning) policy every parallel operation can stall for a whole scheduler slice when
    one of its threads is descheduled, which penalises code made of many small operations;
    passive waiting measures the algorithms, not the scheduler. ``"default"``: OpenMP's
    own policy (spin a while, then sleep), as a reader's session has it; it suits kernels
    that make several parallel calls in a row on a quiet machine. ``"active"``: spin.

    An ``OMP_WAIT_POLICY`` already set in the environment wins, so a run can be repeated
    under another policy without editing the script. OpenMP reads the variable when torch
    loads, so this must run before ``import torch``; called later (a script imported into
    a session that has torch), it changes nothing, warns if the request differs, and
    returns the policy in force.
    """
    if policy not in _POLICIES:
        raise ValueError(f"policy must be one of {_POLICIES}, got {policy!r}")
    if "torch" in sys.modules:
        if omp_wait_policy() != policy:
            warnings.warn(
                f"torch is loaded: OpenMP keeps its wait policy {omp_wait_policy()!r}, "
                f"not {policy!r}",
                stacklevel=2,
            )
        return omp_wait_policy()
    chosen = os.environ.get("OMP_WAIT_POLICY", policy).lower()
    if chosen not in _POLICIES:
        raise ValueError(f"OMP_WAIT_POLICY must be one of {_POLICIES}, got {chosen!r}")
    if chosen == "default":
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = chosen.upper()
    return chosen


def omp_wait_policy() -> str:
    """The OpenMP wait policy of this process, as :func:`set_omp_wait_policy` left it."""
    return os.environ.get("OMP_WAIT_POLICY", "default").lower()


# Saved inside the package, so a chapter finds them wherever it runs (a clone, Colab,
# Binder): attention.load_benchmark(name) reads them as package data.
RESULTS = (
    Path(__file__).resolve().parent.parent / "src" / "attention" / "benchmark_results"
)


def load_1min() -> float | None:
    """The 1-minute load average (``None`` where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


def stamp(threads: int = THREADS) -> dict:
    """Who measured: CPU model, core count, thread counts, OpenMP wait policy, torch and
    Python versions, date and time (UTC). :func:`finish` adds the load readings."""
    import torch

    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": threads,
        "memory_threads": MEMORY_THREADS,
        "omp_wait_policy": omp_wait_policy(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": now.date().isoformat(),
        "datetime": now.strftime("%Y-%m-%dT%H:%MZ"),
    }


# ---------------------------------------------------------------- the run: load, options, saving


@dataclass
class Run:
    """One script's run: its options and the load average read when it started."""

    name: str
    out: Path
    allow_loaded: bool
    quick: bool
    load_before: float | None
    allowance_before: float = 0.0
    started: float = field(default_factory=time.perf_counter)


def _loaded(load: float | None, allowance: float = 0.0) -> bool:
    """Load above the core count, once ``allowance`` (this benchmark's own busy processes) is taken off."""
    return load is not None and load - allowance > (os.cpu_count() or 1)


def begin(name: str, argv: list[str] | None = None) -> Run:
    """Parse the common options, read the load average, refuse a loaded machine.

    Exits with status 3 (before measuring anything) when the 1-minute load average is above
    the core count, unless ``--allow-loaded`` is given.
    """
    parser = argparse.ArgumentParser(
        description=f"benchmarks/{name}.py (see its docstring)"
    )
    parser.add_argument(
        "--allow-loaded",
        action="store_true",
        help="measure and save on a loaded machine; the result says quiet: false",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for <name>.json (default: the package's benchmark_results)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, few repeats: checks that the script runs; saves to a "
        "temporary folder unless --out is given",
    )
    args = parser.parse_args(argv)
    out = args.out
    if out is None:
        out = (
            Path(tempfile.gettempdir()) / "attention-bench-quick"
            if args.quick
            else RESULTS
        )
    load = load_1min()
    # run_all.py sets BENCH_LOAD_ALLOWANCE=1 after its first script: the previous script's
    # one busy thread is still in the 1-minute average when the next one starts.
    allowance = float(os.environ.get("BENCH_LOAD_ALLOWANCE", "0"))
    print(
        f"{name}: {cpu_model()}, {os.cpu_count()} cores, {THREADS} thread(s) for time, "
        f"{MEMORY_THREADS} for memory, OMP_WAIT_POLICY {omp_wait_policy()}, load {load}",
        flush=True,
    )
    if _loaded(load, allowance) and not args.allow_loaded:
        print(
            f"{name}: the 1-minute load average {load} is above the {os.cpu_count()} cores: "
            "refusing to measure (wait for a quiet machine, or pass --allow-loaded to save a "
            "result marked quiet: false)",
            file=sys.stderr,
        )
        raise SystemExit(3)
    return Run(
        name=name,
        out=out,
        allow_loaded=args.allow_loaded,
        quick=args.quick,
        load_before=load,
        allowance_before=allowance,
    )


def finish(
    run: Run,
    data: dict,
    *,
    threads: int = THREADS,
    repeat: int = MIN_REPEAT,
    own_load: float = 1.0,
) -> Path:
    """Stamp ``data``, read the load again and save ``<out>/<name>.json``; returns the path.

    Adds ``stamp`` (see the module docstring) and ``quiet``. Refuses to save (exit status
    3) when either load reading was above the core count, unless ``--allow-loaded``.
    ``own_load``: the busy processes the benchmark itself kept running (1 for a one-thread
    script; the ring benchmark runs up to 4), taken off the reading after the run.
    """
    after = load_1min()
    quiet = not (
        _loaded(run.load_before, run.allowance_before) or _loaded(after, own_load)
    )
    if not quiet and not run.allow_loaded:
        print(
            f"{run.name}: the load average rose to {after} (above {os.cpu_count()} cores) "
            "during the run: not saved (pass --allow-loaded to save it marked quiet: false)",
            file=sys.stderr,
        )
        raise SystemExit(3)
    st = stamp(threads)
    st.update(
        {
            "load_average": [run.load_before, after],  # 1-minute load: [before, after]
            "load_1min_before": run.load_before,
            "load_1min_after": after,
            "load_own_allowance": [run.allowance_before, own_load],
            "quiet": quiet,
            "repeat": repeat,
            "quick": run.quick,
        }
    )
    data = {
        "stamp": st,
        "quiet": quiet,
        **{k: v for k, v in data.items() if k != "stamp"},
    }
    if "load_average" in data:  # the key older results had: [before, after]
        data["load_average"] = [run.load_before, after]
    run.out.mkdir(parents=True, exist_ok=True)
    path = run.out / f"{run.name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(
        f"{run.name}: saved {path} ({time.perf_counter() - run.started:.0f} s, load "
        f"{run.load_before} -> {after}{'' if quiet else ', NOT quiet'})",
        flush=True,
    )
    return path


# ---------------------------------------------------------------- timing


def quartiles(samples: list[float]) -> dict:
    """``{"median", "q1", "q3"}`` of a list of times (inclusive quartiles)."""
    if len(samples) == 1:
        return {"median": samples[0], "q1": samples[0], "q3": samples[0]}
    q1, med, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return {"median": med, "q1": q1, "q3": q3}


def separated(a: dict, b: dict) -> bool:
    """True when the interquartile ranges of two :func:`quartiles` results do not overlap."""
    return a["q3"] < b["q1"] or b["q3"] < a["q1"]


def interleaved_samples(
    fns: dict, *, warmup: int = 2, repeat: int = MIN_REPEAT, clock=time.perf_counter
) -> dict:
    """Every timed sample of several contenders, run round-robin after ``warmup`` rounds.

    Returns ``{name: [seconds, ...]}``; ``clock`` is ``time.perf_counter`` (wall) or, with
    one thread, ``time.thread_time`` (the CPU time of the one compute thread).
    """
    import torch

    with torch.inference_mode():
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        times = {name: [] for name in fns}
        for _ in range(repeat):
            for name, fn in fns.items():
                t0 = clock()
                fn()
                times[name].append(clock() - t0)
    return times


def interleaved_clocks(
    fns: dict, *, warmup: int = 2, repeat: int = MIN_REPEAT
) -> tuple[dict, dict]:
    """Every timed sample on two clocks at once, run round-robin after ``warmup`` rounds.

    Returns ``(wall, cpu)``, each ``{name: [seconds, ...]}``: ``time.perf_counter`` and
    ``time.thread_time`` (with one thread, the CPU time of the one compute thread, which a
    busy neighbour process does not inflate).
    """
    import torch

    wall = {name: [] for name in fns}
    cpu = {name: [] for name in fns}
    with torch.inference_mode():
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        for _ in range(repeat):
            for name, fn in fns.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                fn()
                cpu[name].append(time.thread_time() - c0)
                wall[name].append(time.perf_counter() - t0)
    return wall, cpu


def interleaved_stats(fns: dict, *, warmup: int = 2, repeat: int = MIN_REPEAT) -> dict:
    """Median and quartiles of several contenders, run round-robin: ``{name: quartiles}``."""
    return {
        name: quartiles(ts)
        for name, ts in interleaved_samples(fns, warmup=warmup, repeat=repeat).items()
    }


def interleaved_times(fns: dict, *, warmup: int = 2, repeat: int = MIN_REPEAT) -> dict:
    """Median times of several contenders, run round-robin so load spikes hit all alike."""
    return {
        name: s["median"]
        for name, s in interleaved_stats(fns, warmup=warmup, repeat=repeat).items()
    }


def spread(stats: list[dict]) -> tuple[list, list, list]:
    """Per-size lists ``(median, q1, q3)`` from a list of :func:`quartiles` results."""
    return (
        [s["median"] for s in stats],
        [s["q1"] for s in stats],
        [s["q3"] for s in stats],
    )


def log_slope(ns, ys) -> float:
    """Least-squares slope of log y against log n (1 = linear growth, 2 = quadratic)."""
    import math

    xs = [math.log(n) for n in ns]
    ls = [math.log(y) for y in ys]
    mx, my = sum(xs) / len(xs), sum(ls) / len(ls)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ls, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


# ---------------------------------------------------------------- memory


def peak_memory_mib(target: str, *, threads: int = MEMORY_THREADS, **kwargs) -> float:
    """Extra peak resident memory (MiB) of one call, measured in a fresh subprocess.

    The one memory probe of the benchmarks. ``target`` is ``"module:function"`` importable
    from ``benchmarks/``; the function takes ``**kwargs``, builds its inputs and returns a
    zero-argument callable, run with ``threads`` torch threads (and this process's OpenMP
    wait policy, which the subprocess inherits). The probe calls it
    once on the inputs to pay one-time library loading, then resets the kernel's peak-RSS
    counter (``/proc/self/clear_refs``; Linux) and reports the peak during a second call minus
    the resident size just before it. ``ru_maxrss`` is not used: Linux carries it across
    ``exec``, so a probe started by a parent that once held a lot of memory reads that.
    ``MALLOC_MMAP_THRESHOLD_`` is fixed so that glibc returns every buffer over 64 KiB to
    the system when it is freed; by default the threshold grows after the first call, and
    the second call then reuses freed, still-resident memory and seems to need none.
    """
    code = (
        "import importlib, json, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "def status(key):\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith(key + ':'):\n"
        "            return int(line.split()[1]) / 1024\n"
        f"mod, fn = {target!r}.split(':')\n"
        "module = importlib.import_module(mod)  # sets its OpenMP policy before torch loads\n"
        "import torch\n"
        f"torch.set_num_threads({int(threads)})\n"
        f"run = getattr(module, fn)(**json.loads({json.dumps(kwargs)!r}))\n"
        "with torch.inference_mode():\n"
        "    run()\n"
        "    before = status('VmRSS')\n"
        "    open('/proc/self/clear_refs', 'w').write('5')\n"
        "    run()\n"
        "    peak = status('VmHWM')\n"
        "print(max(peak - before, 0.0))\n"
    )
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return float(out.stdout.strip().splitlines()[-1])


def save_results(name: str, data: dict) -> Path:
    """Write ``data`` to ``src/attention/benchmark_results/<name>.json`` (no load check;
    scripts use :func:`finish`)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
