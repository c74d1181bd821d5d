"""Shared protocol, timing, memory and result-saving helpers for the benchmark scripts.

The protocol every script follows (so a reader can trust and compare the saved numbers):

* **One setting for every contender and every script.** Times are taken with
  :data:`THREADS` intra-op thread(s), memory with :data:`MEMORY_THREADS`, under the
  OpenMP wait policy :data:`OMP_POLICY`; all three are recorded in the stamp. One
  thread: on a small machine shared with other work a multi-threaded call stalls
  whenever one of its threads is descheduled, and a one-thread ratio is a property of
  the algorithms that transfers between machines of different core counts. With one
  thread OpenMP has no worker to keep waiting, so the wait policy hardly matters;
  ``"passive"`` is recorded so that a run with more threads (``BENCH_THREADS``) is still
  comparable between scripts. (A quick check on a busy 2-core machine, fused SDPA,
  block-sparse, sliding-window and linear attention at N = 4096: one-thread times equal
  within noise under passive and default waiting; two-thread times slower than one
  thread and erratic under either.)
* **Spread, not one median.** Contenders run interleaved (round-robin, so a burst of
  load hits all alike), at least :data:`MIN_REPEAT` timed repeats after warm-up; the
  median and the interquartile range are saved: the quartiles of a median saved under
  key ``K`` are ``K_q1`` and ``K_q3``, beside it and with its layout (``time_s`` ->
  ``time_s_q1``). A ratio is worth quoting where the ranges of its two contenders do not
  overlap (:func:`separated`; scripts save ``*_separated`` flags).
* **The strongest baseline.** Where PyTorch has a fused kernel for the same result
  (``torch.nn.functional.scaled_dot_product_attention``), it is among the contenders.
* **A quiet machine, named.** The 1-minute load average is read before and after; a
  script refuses to start or to save when it is above the core count, unless run with
  ``--allow-loaded``, which saves the result with ``"quiet": false``. The benchmark's
  own busy processes are taken off first (``load_own_allowance``: [before, after]; 1
  after a one-thread script, 4 after the ring's four ranks, 1 before a script that
  ``run_all.py`` starts right after another). The stamp names the CPU model, cores,
  threads, policy, torch, Python, date and time and load.

A script is a docstring (what it measures, the keys it saves), its contenders as
zero-argument callables, and a ``main`` around :func:`sweep`::

    from _common import OMP_POLICY, set_omp_wait_policy

    OMP_WAIT_POLICY = set_omp_wait_policy(OMP_POLICY)  # must come before `import torch`

    import torch
    from _common import begin, finish, sweep

    ORDER = 25  # its place in run_all.py's session


    def make_fast(n):  # module level: the memory probe imports it by name
        x = torch.randn(n)
        return lambda: fast(x)


    def main():
        run = begin("name")  # parses --allow-loaded, --out DIR, --quick; checks load
        sizes = [64, 128] if run.quick else [1024, 2048, 4096]
        result = sweep(run, sizes, {"fast": make_fast, "slow": make_slow}, memory=True)
        # stamps, checks the load again, saves <out>/name.json
        finish(run, {"n": sizes, **result})

Keys the protocol adds to every result (beside the script's own):

* ``stamp``: ``cpu``, ``cores``, ``threads`` (time), ``memory_threads``,
  ``omp_wait_policy``, ``torch``, ``python``, ``date`` (ISO day, as before),
  ``datetime`` (UTC, to the minute), ``load_average`` (the 1-minute load, [before,
  after]), ``load_1min_before``, ``load_1min_after``, ``load_own_allowance``, ``quiet``,
  ``repeat`` (timed repeats per contender, at least), ``quick`` (true only for smoke
  runs), and whatever a script adds (``extra_stamp``: a GPU's name, say);
* ``quiet``: true when neither load reading was above the core count.

Options of every script: ``--allow-loaded`` (measure and save on a loaded machine,
marked ``"quiet": false``), ``--out DIR`` (save there instead of the package's
``benchmark_results``), ``--quick`` (tiny sizes and few repeats, to check that a script
runs; saves to a temporary folder unless ``--out`` is given, never over the shipped
results; its memory probes run in the script's own process, so their numbers mean
nothing). A script may add its own (``begin(..., options=...)``).

This module imports torch only inside its functions, so importing it first is safe.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import inspect
import io
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_POLICIES = ("passive", "active", "default")

#: Intra-op threads of every timed call, in every script.
THREADS = int(os.environ.get("BENCH_THREADS", "1"))
#: Intra-op threads of every memory probe, in every script.
MEMORY_THREADS = 1
#: The OpenMP wait policy of every script (an ``OMP_WAIT_POLICY`` in the environment
#: wins).
OMP_POLICY = "passive"
#: The fewest timed repeats of a contender after warm-up (``--quick`` runs excepted).
MIN_REPEAT = 7
#: Timed repeats of a ``--quick`` run (a smoke test: enough for quartiles, no more).
QUICK_REPEAT = 3


def set_omp_wait_policy(policy: str) -> str:
    """Choose OpenMP's wait policy for this run and its memory probes; returns the one
    in force.

    ``"passive"``: idle OpenMP threads sleep at once. On a shared machine, with the
    default (spinning) policy every parallel operation can stall for a whole scheduler
    slice when one of its threads is descheduled, which penalises code made of many
    small operations; passive waiting measures the algorithms, not the scheduler.
    ``"default"``: OpenMP's own policy (spin a while, then sleep), as a reader's session
    has it; it suits kernels that make several parallel calls in a row on a quiet
    machine. ``"active"``: spin.

    An ``OMP_WAIT_POLICY`` already set in the environment wins, so a run can be repeated
    under another policy without editing the script. OpenMP reads the variable when
    torch loads, so this must run before ``import torch``; called later (a script
    imported into a session that has torch), it changes nothing, warns if the request
    differs, and returns the policy in force.
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
    """The OpenMP wait policy of this process (as :func:`set_omp_wait_policy` left
    it)."""
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
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform``
    knows)."""
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

    now = _dt.datetime.now(_dt.UTC)
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


# ------------------------------------------------------- the run: load, options, saving


@dataclass
class Run:
    """One script's run: its options and the load average read when it started.

    ``repeat``: the timed repeats of each contender (:data:`MIN_REPEAT`, or
    :data:`QUICK_REPEAT` with ``--quick``); ``args``: every parsed option, a script's
    own included.
    """

    name: str
    out: Path
    allow_loaded: bool
    quick: bool
    load_before: float | None
    allowance_before: float = 0.0
    repeat: int = MIN_REPEAT
    args: argparse.Namespace = field(default_factory=argparse.Namespace)
    started: float = field(default_factory=time.perf_counter)


def _loaded(load: float | None, allowance: float = 0.0) -> bool:
    """Load above the core count, once ``allowance`` (this benchmark's own busy
    processes) is taken off."""
    return load is not None and load - allowance > (os.cpu_count() or 1)


def begin(
    name: str,
    argv: list[str] | None = None,
    *,
    options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> Run:
    """Parse the common options, read the load average, refuse a loaded machine.

    ``options`` may add a script's own arguments to the parser (they land in
    ``Run.args``). Exits with status 3 (before measuring anything) when the 1-minute
    load average is above the core count, unless ``--allow-loaded`` is given.
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
    if options is not None:
        options(parser)
    args = parser.parse_args(argv)
    out = args.out
    if out is None:
        out = (
            Path(tempfile.gettempdir()) / "attention-bench-quick"
            if args.quick
            else RESULTS
        )
    load = load_1min()
    # run_all.py sets BENCH_LOAD_ALLOWANCE=1 after its first script: the previous
    # script's one busy thread is still in the 1-minute average when the next one
    # starts.
    allowance = float(os.environ.get("BENCH_LOAD_ALLOWANCE", "0"))
    print(
        f"{name}: {cpu_model()}, {os.cpu_count()} cores, {THREADS} thread(s) for time, "
        f"{MEMORY_THREADS} for memory, OMP_WAIT_POLICY {omp_wait_policy()}, "
        f"load {load}",
        flush=True,
    )
    if _loaded(load, allowance) and not args.allow_loaded:
        print(
            f"{name}: the 1-minute load average {load} is above the {os.cpu_count()} "
            "cores: refusing to measure (wait for a quiet machine, or pass "
            "--allow-loaded to save a result marked quiet: false)",
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
        repeat=QUICK_REPEAT if args.quick else MIN_REPEAT,
        args=args,
    )


def protocol_config(run: Run, **values) -> dict:
    """A result's ``config``: the script's own ``values`` and the protocol's settings
    (``threads``, ``omp_wait_policy``, ``repeat``; a value given wins), so a reader of
    the ``config`` alone sees how it was measured. (A script that probes memory may add
    ``memory_threads=MEMORY_THREADS``; the stamp records every setting anyway.)"""
    protocol = {
        "threads": THREADS,
        "omp_wait_policy": omp_wait_policy(),
        "repeat": run.repeat,
    }
    return {**values, **{k: v for k, v in protocol.items() if k not in values}}


def finish(
    run: Run,
    data: dict,
    *,
    threads: int = THREADS,
    repeat: int | None = None,
    own_load: float = 1.0,
    extra_stamp: dict | None = None,
) -> Path:
    """Stamp ``data``, read the load again and save ``<out>/<name>.json``; returns the
    path.

    Adds ``stamp`` (see the module docstring; ``extra_stamp`` is merged into it) and
    ``quiet``. Refuses to save (exit status 3) when either load reading was above the
    core count, unless ``--allow-loaded``. ``repeat``: the fewest timed repeats of a
    contender (default ``run.repeat``). ``own_load``: the busy processes the benchmark
    itself kept running (1 for a one-thread script; the ring benchmark runs up to 4),
    taken off the reading after the run.
    """
    after = load_1min()
    quiet = not (
        _loaded(run.load_before, run.allowance_before) or _loaded(after, own_load)
    )
    if not quiet and not run.allow_loaded:
        print(
            f"{run.name}: the load average rose to {after} (above {os.cpu_count()} "
            "cores) during the run: not saved (pass --allow-loaded to save it marked "
            "quiet: false)",
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
            "repeat": run.repeat if repeat is None else repeat,
            "quick": run.quick,
            **(extra_stamp or {}),
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
    """True when the interquartile ranges of two :func:`quartiles` results do not
    overlap."""
    return a["q3"] < b["q1"] or b["q3"] < a["q1"]


def _is_cuda(device) -> bool:
    return device is not None and str(device).startswith("cuda")


def interleaved_clocks(
    fns: Mapping[str, Callable[[], Any]],
    *,
    warmup: int = 2,
    repeat: int = MIN_REPEAT,
    device=None,
    block: int = 1,
) -> tuple[dict, dict]:
    """Every timed sample on two clocks at once, run round-robin after ``warmup``
    rounds, under ``torch.inference_mode()``.

    ``block > 1`` times each contender in its own loop: in every round a contender
    makes one untimed call (its tensors come back into the processor's caches, which
    the previous contender may have swept), then ``block`` timed calls in a row, each
    one sample. The rounds still alternate, so a slow spell hits every contender.

    Returns ``(wall, cpu)``, each ``{name: [seconds, ...]}``: ``time.perf_counter`` and
    ``time.thread_time`` (with one thread, the CPU time of the one compute thread, which
    a busy neighbour process does not inflate). On a CUDA ``device`` the wall time of a
    call is the time between two CUDA events recorded around it, the device
    synchronised before the call and after it (the launch returns before the GPU has
    finished), and ``cpu`` is the host thread's time.
    """
    import torch

    cuda = _is_cuda(device)
    wall: dict[str, list[float]] = {name: [] for name in fns}
    cpu: dict[str, list[float]] = {name: [] for name in fns}
    with torch.inference_mode():
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        for _ in range(repeat):
            for name, fn in fns.items():
                if block > 1:
                    fn()  # untimed: this contender's tensors back in the caches
                for _ in range(block):
                    _time_one(name, fn, wall, cpu, cuda, device)
    return wall, cpu


def _time_one(name: str, fn, wall: dict, cpu: dict, cuda: bool, device) -> None:
    """One timed call of ``fn``, appended to ``wall[name]`` and ``cpu[name]``."""
    import torch

    if cuda:
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        c0 = time.thread_time()
        start.record()
        fn()
        end.record()
        end.synchronize()
        cpu[name].append(time.thread_time() - c0)
        wall[name].append(start.elapsed_time(end) / 1e3)  # ms -> s
        return
    t0, c0 = time.perf_counter(), time.thread_time()
    fn()
    cpu[name].append(time.thread_time() - c0)
    wall[name].append(time.perf_counter() - t0)


def interleaved_samples(
    fns: Mapping[str, Callable[[], Any]],
    *,
    warmup: int = 2,
    repeat: int = MIN_REPEAT,
    device=None,
) -> dict:
    """Every timed sample (wall time, seconds) of several contenders, run round-robin
    after ``warmup`` rounds: ``{name: [seconds, ...]}`` (see
    :func:`interleaved_clocks`)."""
    return interleaved_clocks(fns, warmup=warmup, repeat=repeat, device=device)[0]


def interleaved_stats(
    fns: Mapping[str, Callable[[], Any]],
    *,
    warmup: int = 2,
    repeat: int = MIN_REPEAT,
    device=None,
) -> dict:
    """Median and quartiles of several contenders, run round-robin:
    ``{name: quartiles}``."""
    samples = interleaved_samples(fns, warmup=warmup, repeat=repeat, device=device)
    return {name: quartiles(ts) for name, ts in samples.items()}


def agree(reference: str, *others: str, atol: float) -> Callable:
    """A check for :func:`sweep`: each of ``others`` returns what ``reference`` returns,
    within ``atol`` (largest absolute difference), before anything is timed."""

    def check(point, fns: Mapping[str, Callable[[], Any]]) -> None:
        ref = fns[reference]()
        for name in others:
            diff = float((fns[name]() - ref).abs().max())
            assert diff <= atol, (
                f"at {point}: {name} differs from {reference} by {diff} > {atol}"
            )

    return check


def _fmt_s(seconds: float) -> str:
    return f"{1e3 * seconds:.3f} ms" if seconds < 1 else f"{seconds:.3f} s"


def sweep(
    run: Run,
    points: Sequence,
    contenders: Mapping[str, Callable[[Any], Callable[[], Any]]]
    | Callable[[Any], Mapping[str, Callable[[], Any]]],
    *,
    upto: Mapping[str, Any] | None = None,
    check: Callable | Sequence[Callable] = (),
    memory: bool | Collection[str] = False,
    warmup: int = 2,
    repeat: int | Callable[[Any], int] | None = None,
    clocks: str = "wall",
    device=None,
    label: str = "n",
    block: int = 1,
) -> dict:
    """Time several contenders at every point, interleaved, under the protocol.

    ``contenders``: ``{name: maker}``, each ``maker(point)`` returning a zero-argument
    callable, or one function ``point -> {name: callable}``. ``upto``: ``{name: largest
    point}`` for contenders that stop early (``None`` is saved beyond). ``check``: one
    or more ``check(point, fns)`` run before timing at each point (see :func:`agree`).
    ``memory``: ``True`` (or the names to probe) measures each contender's extra peak
    memory at every point with :func:`peak_memory_mib`, before anything is timed (the
    makers must then be module-level functions, which the probe imports by name).
    ``repeat``: timed repeats (default ``run.repeat``), or a function of the point.
    ``clocks``: ``"wall"``, or ``"wall+cpu"`` to save the thread's CPU time too.
    ``device``: a CUDA device is timed with CUDA events (:func:`interleaved_clocks`).
    ``block``: timed calls in a row per contender and round, after one untimed call
    (:func:`interleaved_clocks`); each call is one sample.

    Returns ``{"time_s": {name: [median per point]}, "time_s_q1": ..., "time_s_q3":
    ...}``, plus ``"cpu_s"``, ``"cpu_s_q1"``, ``"cpu_s_q3"`` with ``"wall+cpu"`` and
    ``"peak_mib"`` with ``memory``; ``None`` where a contender did not run. Prints one
    line per point.
    """
    if clocks not in ("wall", "wall+cpu"):
        raise ValueError(f"clocks must be 'wall' or 'wall+cpu', got {clocks!r}")
    upto = upto or {}
    checks = [check] if callable(check) else list(check)

    def runs(name: str, point) -> bool:
        return name not in upto or point <= upto[name]

    def build(point) -> dict:
        if isinstance(contenders, Mapping):
            return {n: make(point) for n, make in contenders.items() if runs(n, point)}
        return {n: fn for n, fn in contenders(point).items() if runs(n, point)}

    result: dict[str, Any] = {}
    if memory:
        if not isinstance(contenders, Mapping):
            raise ValueError("memory needs contenders as {name: module-level maker}")
        probed = contenders if memory is True else memory
        makers = {name: contenders[name] for name in probed}
        result["peak_mib"] = peak_memories(run, makers, points, runs=runs)
    keys = ["time_s", "cpu_s"] if clocks == "wall+cpu" else ["time_s"]
    names: list[str] = list(contenders) if isinstance(contenders, Mapping) else []
    stats: list[dict] = []  # per point: {key: {name: quartiles}}
    for point in points:
        fns = build(point)
        names += [n for n in fns if n not in names]
        if checks:
            import torch

            with torch.inference_mode():
                for c in checks:
                    c(point, fns)
        n_repeat = run.repeat if repeat is None else repeat
        wall, cpu = interleaved_clocks(
            fns,
            warmup=warmup,
            repeat=n_repeat(point) if callable(n_repeat) else n_repeat,
            device=device,
            block=block,
        )
        stats.append(
            {
                "time_s": {n: quartiles(t) for n, t in wall.items()},
                "cpu_s": {n: quartiles(t) for n, t in cpu.items()},
            }
        )
        peaks = {n: v[len(stats) - 1] for n, v in result.get("peak_mib", {}).items()}
        print(
            f"{label} = {point}: "
            + "  ".join(
                f"{n} {_fmt_s(st['median'])}"
                + ("" if peaks.get(n) is None else f" ({peaks[n]:.1f} MiB)")
                for n, st in stats[-1][keys[-1]].items()
            ),
            flush=True,
        )
    for key in keys:
        for suffix, q in (("", "median"), ("_q1", "q1"), ("_q3", "q3")):
            result[key + suffix] = {
                n: [s[key][n][q] if n in s[key] else None for s in stats] for n in names
            }
    return result


# ---------------------------------------------------------------- what a sweep gives


def ratio(result: dict, a: str, b: str, key: str = "time_s") -> list:
    """``a / b`` of the medians at every point (``None`` where either did not run, or
    where ``b`` is 0: a memory probe can read 0)."""
    return [
        None if x is None or not y else x / y
        for x, y in zip(result[key][a], result[key][b], strict=True)
    ]


def separated_at(result: dict, a: str, b: str, key: str = "time_s") -> list:
    """At every point, whether the interquartile ranges of ``a`` and ``b`` do not
    overlap (``None`` where either did not run)."""
    out = []
    for i in range(len(result[key][a])):
        qa, qb = (
            {"q1": result[f"{key}_q1"][n][i], "q3": result[f"{key}_q3"][n][i]}
            for n in (a, b)
        )
        missing = None in (qa["q1"], qb["q1"])
        out.append(None if missing else separated(qa, qb))
    return out


def by_point(series: Mapping[str, Sequence], points: Sequence) -> dict:
    """``{str(point): {name: value}}`` from the ``{name: [value per point]}`` layout of
    a sweep's result."""
    return {
        str(p): {name: values[i] for name, values in series.items()}
        for i, p in enumerate(points)
    }


def with_quartiles(result: dict, key: str = "time_s") -> dict:
    """``{name: [{"median", "q1", "q3"} per point]}`` from a sweep's ``key``,
    ``key_q1`` and ``key_q3``."""
    return {
        name: [
            {"median": m, "q1": a, "q3": b}
            for m, a, b in zip(
                medians,
                result[f"{key}_q1"][name],
                result[f"{key}_q3"][name],
                strict=True,
            )
        ]
        for name, medians in result[key].items()
    }


def log_slope(ns, ys) -> float:
    """Least-squares slope of log y against log n (1 = linear growth, 2 =
    quadratic)."""
    xs = [math.log(n) for n in ns]
    ls = [math.log(y) for y in ys]
    mx, my = sum(xs) / len(xs), sum(ls) / len(ls)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ls, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def _fit_points(points: Sequence, ys: Sequence, start) -> list[int]:
    """Indices fitted: the points from ``start`` on that have a value; all that have
    one when fewer than two do."""
    have = [i for i, y in enumerate(ys) if y is not None]
    fit = [i for i in have if start is None or points[i] >= start]
    return fit if len(fit) >= 2 else have


def fit_slope(points: Sequence, ys, *, start=None, floor: float | None = None):
    """Log-log slope of ``ys`` over ``points`` from ``start`` on (all points when fewer
    than two are that large), skipping ``None``; values below ``floor`` count as
    ``floor`` (a memory probe can read 0). ``ys`` may be ``{name: [...]}``: then one
    slope per name. ``None`` where fewer than two values exist."""
    if isinstance(ys, Mapping):
        return {
            k: fit_slope(points, v, start=start, floor=floor) for k, v in ys.items()
        }
    fit = _fit_points(points, ys, start)
    if len(fit) < 2:
        return None
    vals = [ys[i] if floor is None else max(ys[i], floor) for i in fit]
    return log_slope([points[i] for i in fit], vals)


def local_slopes(points: Sequence, ys, *, start=None, floor: float | None = None):
    """Log-log slopes between neighbouring fitted points (as :func:`fit_slope`)."""
    if isinstance(ys, Mapping):
        return {
            k: local_slopes(points, v, start=start, floor=floor) for k, v in ys.items()
        }
    fit = _fit_points(points, ys, start)
    vals = [ys[i] if floor is None else max(ys[i], floor) for i in fit]
    return [
        log_slope([points[fit[k]], points[fit[k + 1]]], vals[k : k + 2])
        for k in range(len(fit) - 1)
    ]


# ---------------------------------------------------------------- memory

_PROBE = """\
import importlib, json, sys
sys.path.insert(0, {folder!r})
def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key + ':'):
            return int(line.split()[1]) / 1024
mod, fn = {target!r}.split(':')
module = importlib.import_module(mod)  # sets its OpenMP policy before torch loads
import torch
torch.set_num_threads({threads})
run = getattr(module, fn)(*json.loads({args!r}), **json.loads({kwargs!r}))
with torch.inference_mode():
    run()
    before = status('VmRSS')
    open('/proc/self/clear_refs', 'w').write('5')
    run()
    peak = status('VmHWM')
print(max(peak - before, 0.0))
"""


def peak_memory_mib(
    target: str, *args, threads: int = MEMORY_THREADS, fresh: bool = True, **kwargs
) -> float:
    """Extra peak resident memory (MiB) of one call, measured in a fresh subprocess.

    The one memory probe of the benchmarks. ``target`` is ``"module:function"``
    importable from ``benchmarks/``; the function takes ``*args, **kwargs`` (JSON
    values), builds its inputs and returns a zero-argument callable, run with
    ``threads`` torch threads (and this process's OpenMP wait policy, which the
    subprocess inherits). The probe calls it once on the inputs to pay one-time library
    loading, then resets the kernel's peak-RSS counter (``/proc/self/clear_refs``;
    Linux) and reports the peak during a second call minus the resident size just
    before it. ``ru_maxrss`` is not used: Linux carries it across ``exec``, so a probe
    started by a parent that once held a lot of memory reads that.
    ``MALLOC_MMAP_THRESHOLD_`` is fixed so that glibc returns every buffer over 64 KiB
    to the system when it is freed; by default the threshold grows after the first
    call, and the second call then reuses freed, still-resident memory and seems to
    need none.

    ``fresh=False`` (``--quick`` runs) runs the same probe in this process instead: it
    checks that the code runs, and its number means nothing.
    """
    code = _PROBE.format(
        folder=str(Path(__file__).resolve().parent),
        target=target,
        threads=int(threads),
        args=json.dumps(list(args)),
        kwargs=json.dumps(kwargs),
    )
    if not fresh:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "<memory probe>", "exec"), {"__name__": "_probe"})
        return float(printed.getvalue().strip().splitlines()[-1])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return float(out.stdout.strip().splitlines()[-1])


def peak_memories(
    run: Run,
    makers: Mapping[str, Callable],
    points: Sequence,
    *,
    runs: Callable[[str, Any], bool] = lambda name, point: True,
) -> dict:
    """``{name: [extra peak MiB per point]}`` of module-level makers (see
    :func:`peak_memory_mib`; in this process under ``--quick``), ``None`` where
    ``runs(name, point)`` is false. Call it before this process holds large tensors."""
    peaks: dict[str, list] = {}
    for name, make in makers.items():
        module = Path(inspect.getfile(make)).stem
        if make.__name__ == "<lambda>" or "." in make.__qualname__:
            raise ValueError(f"{name}: the memory probe needs a module-level function")
        target = f"{module}:{make.__name__}"
        peaks[name] = [
            peak_memory_mib(target, p, fresh=not run.quick) if runs(name, p) else None
            for p in points
        ]
    return peaks
