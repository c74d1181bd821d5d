"""Set-up shared by every chapter notebook, and the one way a chapter reports a
comparison.

``setup_notebook`` fixes seeds, printing, threads and the figure style. ``report_close``
asserts that two results agree within a stated tolerance and prints that tolerance,
never the measured rounding error: the last bits of a sum depend on the CPU, the BLAS
code path, the thread count and flush-to-zero, so a printed ``6.66e-16`` is an accident
of one machine, while "within 1e-12" is a claim that holds on every machine.
"""

from __future__ import annotations

import json
import math
import random
from importlib import resources

import numpy as np
import torch

from .._checks import check_has_data, check_int, check_real
from .plotting import use_course_style

__all__ = ["setup_notebook", "report_close", "load_benchmark", "benchmark_machine"]


def setup_notebook(seed: int = 0, *, precision: int = 4, threads: int = 1) -> None:
    """Make a notebook's printed numbers reproducible across runs and machines.

    Seeds Python, NumPy and PyTorch; prints tensors and arrays with ``precision``
    decimals and no scientific notation; fixes the number of CPU threads (a different
    thread count can change the order of floating-point sums and so the last digits);
    applies the course's figure style (sharp, column-sized figures).

    Args:
        seed: seed for every random generator.
        precision: decimals shown when printing tensors and arrays.
        threads: CPU threads PyTorch may use.
    """
    # every argument is checked before any global state (seeds, threads, style) changes
    seed = check_int("seed", seed, minimum=0)
    precision = check_int("precision", precision, minimum=0)
    threads = check_int("threads", threads, minimum=1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.set_printoptions(precision=precision, sci_mode=False)
    np.set_printoptions(precision=precision, suppress=True)
    use_course_style()


def _fmt(x: float) -> str:
    """A tolerance in its shortest readable form: 1e-12, 0.001, 0.5, 2."""
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:g}"
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def report_close(
    name: str, actual, expected, *, atol: float, rtol: float = 0.0
) -> None:
    """Assert that ``actual`` and ``expected`` agree within a tolerance, and print the
    tolerance.

    Elementwise, ``|actual - expected| <= atol + rtol * |expected|`` must hold, with NaN
    agreeing only with NaN at the same place and infinities only with the same infinity
    (as ``torch.testing.assert_close(..., equal_nan=True)``). What is printed is the
    bound that was asserted, in one compact line, e.g.
    ``✓ softmax vs torch: within 1e-12``, so the line is the same on every machine;
    ``atol=rtol=0`` asserts exact equality and prints "exact" (use it only where
    exactness holds by construction, not for sums).

    Args:
        name: what is compared, as the reader should see it.
        actual, expected: tensors, arrays or numbers of broadcastable shapes.
        atol: absolute tolerance (keyword-only, required: choose it, don't inherit it).
        rtol: relative tolerance.

    Raises:
        AssertionError: naming the largest measured difference when the bound is broken.
        ValueError: for a negative or non-finite tolerance, shapes that don't broadcast,
            or a tensor on the meta device (it has no values to compare).

    Example:
        >>> import torch
        >>> from attention import report_close
        >>> x = torch.tensor([1.0, 2.0], dtype=torch.float64)
        >>> report_close("x + 0 vs x", x + 0.0, x, atol=1e-12)
        ✓ x + 0 vs x: within 1e-12
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    for label, tol in (("atol", atol), ("rtol", rtol)):
        if isinstance(tol, bool) or not isinstance(tol, (int, float)):
            raise TypeError(f"{label} must be a number, got {type(tol).__name__}")
        if not math.isfinite(check_real(label, tol)) or tol < 0:  # 10**400: ValueError
            raise ValueError(f"{label} must be finite and >= 0, got {tol}")
    for label, x in (("actual", actual), ("expected", expected)):
        if isinstance(x, torch.Tensor):
            check_has_data(label, x)  # a meta tensor has no values to compare
    # Python numbers and NumPy arrays are taken at float64, so nothing is lost before
    # the comparison (torch.as_tensor would make a Python float float32).
    a = (
        actual.detach().to("cpu")
        if isinstance(actual, torch.Tensor)
        else torch.as_tensor(
            np.asarray(
                actual, dtype=np.complex128 if np.iscomplexobj(actual) else np.float64
            )
        )
    )
    e = (
        expected.detach().to("cpu")
        if isinstance(expected, torch.Tensor)
        else torch.as_tensor(
            np.asarray(
                expected,
                dtype=np.complex128 if np.iscomplexobj(expected) else np.float64,
            )
        )
    )
    if a.is_complex() or e.is_complex():
        a, e = (
            torch.view_as_real(a.to(torch.complex128)),
            torch.view_as_real(e.to(torch.complex128)),
        )
    a, e = a.to(torch.float64), e.to(torch.float64)
    try:
        a, e = torch.broadcast_tensors(a, e)
    except RuntimeError:
        raise ValueError(
            f"{name}: shapes {tuple(a.shape)} and {tuple(e.shape)} do not broadcast"
        ) from None
    both_nan = a.isnan() & e.isnan()
    same_inf = a.isinf() & (a == e)
    diff = (a - e).abs()
    bound = atol + rtol * e.abs()
    ok = both_nan | same_inf | (diff <= bound)
    if not bool(ok.all()):
        bad = ~ok
        worst = diff.masked_fill(~bad, -1.0)
        idx = int(worst.argmax())
        where = tuple(int(k) for k in np.unravel_index(idx, a.shape)) if a.dim() else ()
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {a.numel()} values differ by more than "
            f"atol={_fmt(atol)} + rtol={_fmt(rtol)}·|expected|; largest difference "
            f"{float(diff.flatten()[idx]):.3e} at index {where} (actual "
            f"{float(a.flatten()[idx])!r}, expected {float(e.flatten()[idx])!r})"
        )
    if atol == 0 and rtol == 0:
        bound = "exact"
    elif rtol == 0:
        bound = f"within {_fmt(atol)}"
    elif atol == 0:
        bound = f"within {_fmt(rtol)} relative"
    else:
        bound = f"within {_fmt(atol)} + {_fmt(rtol)}·|expected|"
    print(f"✓ {name}: {bound}")


def load_benchmark(name: str) -> dict:
    """The saved results of ``benchmarks/<name>.py``, shipped inside the package.

    The benchmark scripts write ``attention/benchmark_results/<name>.json``; reading it
    as package data means a chapter finds it wherever it runs (a clone, Colab, Binder).

    Args:
        name: the benchmark's name, e.g. ``"tiled"`` for ``benchmarks/tiled.py``.

    Returns:
        The parsed JSON: the machine stamp and the measurements.

    Example:
        >>> from attention import load_benchmark
        >>> # who measured: CPU, threads, torch version
        >>> "stamp" in load_benchmark("tiled")
        True
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    folder = resources.files("attention") / "benchmark_results"
    available = sorted(
        p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json")
    )
    if name not in available:
        raise ValueError(
            f"no saved benchmark named {name!r}; available: {', '.join(available)}"
        )
    return json.loads((folder / f"{name}.json").read_text())


def _load_readings(result: dict) -> tuple[float | None, float | None]:
    """The 1-minute load average before and after a run, wherever the result keeps
    it."""
    st = result.get("stamp", {})
    if "load_1min_before" in st or "load_1min_after" in st:
        return st.get("load_1min_before"), st.get("load_1min_after")
    load = result.get(
        "load_average"
    )  # older results: [before, after] or os.getloadavg()
    if isinstance(load, (list, tuple)) and load:
        return load[0], (load[1] if len(load) == 2 else None)
    return None, None


def benchmark_machine(result) -> str:
    """One line naming the machine and conditions of a saved benchmark, for a chapter to
    print.

    Reads the result's ``stamp``: CPU model, cores, threads for time (and for memory
    when recorded), OpenMP wait policy, torch version, date (and UTC time when recorded)
    and the 1-minute load average before and after the run, with whether it was quiet
    (load at most the core count). A figure from a benchmark holds for the machine this
    line names.

    Args:
        result: a benchmark's name (as for :func:`load_benchmark`) or its loaded result.

    Returns:
        A line such as ``"AMD EPYC, 2 cores, 1 thread (memory: 1), OpenMP passive, torch
        2.13.0, 2026-11-25 20:30 UTC, load 0.31 -> 0.52 (quiet)"``.

    Example:
        >>> from attention import benchmark_machine
        >>> "cores" in benchmark_machine("tiled")
        True
    """
    if isinstance(result, str):
        result = load_benchmark(result)
    if not isinstance(result, dict):
        raise TypeError(
            "result must be a benchmark name or a loaded result, "
            f"got {type(result).__name__}"
        )
    st = result.get("stamp")
    if not isinstance(st, dict):
        raise ValueError(
            "the result has no 'stamp': it was not saved by a benchmark script"
        )
    threads = st.get("threads")
    parts = [str(st.get("cpu", "unknown CPU")), f"{st.get('cores', '?')} cores"]
    text = f"{threads} thread{'' if threads == 1 else 's'}"
    if "memory_threads" in st:
        text += f" (memory: {st['memory_threads']})"
    parts.append(text)
    policy = st.get("omp_wait_policy") or result.get("config", {}).get(
        "omp_wait_policy"
    )
    if policy:
        parts.append(f"OpenMP {str(policy).lower()}")
    parts.append(f"torch {st.get('torch', '?')}")
    when = st.get("datetime")
    parts.append(
        when.replace("T", " ").replace("Z", " UTC")
        if when
        else str(st.get("date", "undated"))
    )
    before, after = _load_readings(result)
    if before is None and after is None:
        parts.append("load not recorded")
    else:
        fmt = lambda x: "?" if x is None else f"{x:.2f}"
        quiet = result.get("quiet", st.get("quiet"))
        if quiet is None and isinstance(st.get("cores"), int):
            quiet = all(x is None or x <= st["cores"] for x in (before, after))
        parts.append(
            f"load {fmt(before)} -> {fmt(after)}"
            + ("" if quiet is None else (" (quiet)" if quiet else " (NOT quiet)"))
        )
    return ", ".join(parts)
