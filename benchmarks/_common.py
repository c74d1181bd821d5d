"""Shared timing, memory and result-saving helpers for the benchmark scripts.

The machines this runs on are noisy, so every script compares contenders measured side
by side in one run and reports ratios; absolute times are saved only as context.

Every script opens the same way, choosing OpenMP's wait policy before torch loads (the
choice is recorded in the saved JSON by :func:`stamp`)::

    from _common import set_omp_wait_policy

    set_omp_wait_policy("passive")  # or "default"; must come before `import torch`
    import torch

This module imports torch only inside its functions, so importing it is safe first.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

_POLICIES = ("passive", "active", "default")


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
            warnings.warn(f"torch is loaded: OpenMP keeps its wait policy {omp_wait_policy()!r}, "
                          f"not {policy!r}", stacklevel=2)
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
RESULTS = Path(__file__).resolve().parent.parent / "src" / "attention" / "benchmark_results"


def stamp(threads: int) -> dict:
    """Who measured: CPU model, core count, thread count, OpenMP wait policy, torch and
    Python versions, date."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "threads": threads,
        "omp_wait_policy": omp_wait_policy(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": _dt.date.today().isoformat(),
    }


def median_time(fn, *, warmup: int = 2, repeat: int = 7) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeat`` runs after ``warmup`` runs."""
    import torch

    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved_times(fns: dict, *, warmup: int = 2, repeat: int = 7) -> dict:
    """Median times of several contenders, run round-robin so load spikes hit all alike."""
    import torch

    with torch.inference_mode():
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        times = {name: [] for name in fns}
        for _ in range(repeat):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def peak_memory_mib(target: str, *, threads: int = 1, **kwargs) -> float:
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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=env)
    return float(out.stdout.strip().splitlines()[-1])


def save_results(name: str, data: dict) -> Path:
    """Write ``data`` to ``src/attention/benchmark_results/<name>.json`` and return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
