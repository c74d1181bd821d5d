"""The benchmark scripts: the protocol's helpers, and every script run at smoke sizes.

No timing is asserted (speed claims live in the saved results). The slow tests run each
``benchmarks/<name>.py --quick`` into a temporary folder, so that no script can rot
unseen, and check that it still saves every key of the result the chapters read.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
RESULTS = ROOT / "src" / "attention" / "benchmark_results"
SCRIPTS = sorted(
    p.stem
    for p in BENCH.glob("*.py")
    if not p.stem.startswith("_") and p.stem != "run_all"
)

sys.path.insert(0, str(BENCH))
import _common
import run_all

sys.path.remove(str(BENCH))


def key_paths(value, prefix: str = "") -> set[str]:
    """Every path from the root of a JSON value to its leaves: ``a/b`` for keys, ``[]``
    for the items of a list, ``#`` for a key that is a number (a size, a context
    length), so that two runs over different sizes have the same paths."""
    if isinstance(value, dict):
        paths = {prefix + "/{}"} if not value else set()
        for key, item in value.items():
            name = "#" if key.lstrip("-").isdigit() else key
            paths |= key_paths(item, f"{prefix}/{name}")
        return paths
    if isinstance(value, list):
        paths = {prefix + "[]"}
        for item in value:
            if isinstance(item, dict | list):
                paths |= key_paths(item, prefix + "[]")
        return paths
    return {prefix}


def test_key_paths_treat_sizes_alike_and_see_a_renamed_key():
    a = {"n": [1, 2], "t": {"128": {"x": 1.0}}, "r": [{"k": None}]}
    b = {"n": [1], "t": {"64": {"x": 2.0}, "256": {"x": 3.0}}, "r": [{"k": 0.5}]}
    assert key_paths(a) == key_paths(b) == {"/n[]", "/t/#/x", "/r[]", "/r[]/k"}
    renamed = {"n": [1], "t": {"64": {"y": 2.0}}, "r": [{"k": 0.5}]}
    assert key_paths(a) - key_paths(renamed) == {"/t/#/x"}


def test_run_all_finds_every_script_in_the_declared_order():
    listed = run_all.discover()
    assert sorted(listed) == SCRIPTS
    orders = [run_all.declared_order(BENCH / f"{name}.py") for name in listed]
    assert orders == sorted(orders) and len(set(orders)) == len(orders), orders
    assert listed[-2:] == ["ring", "triton_flash"]  # the ranks' load, then the GPU


def _fake_run(quick: bool = True) -> _common.Run:
    return _common.Run(
        name="x",
        out=Path("."),
        allow_loaded=True,
        quick=quick,
        load_before=None,
        repeat=_common.QUICK_REPEAT,
    )


def test_sweep_saves_medians_and_quartiles_in_the_protocols_layout():
    import torch

    def make(scale):
        return lambda n: lambda: torch.full((n,), float(scale))

    contenders = {"one": make(1), "two": make(2), "late": make(1)}
    result = _common.sweep(
        _fake_run(),
        [4, 8, 16],
        contenders,
        upto={"two": 8},
        check=_common.agree("one", "late", atol=0.0),
        clocks="wall+cpu",
    )
    assert set(result) == {
        f"{k}{s}" for k in ("time_s", "cpu_s") for s in ("", "_q1", "_q3")
    }
    for series in result.values():
        assert list(series) == ["one", "two", "late"]
        assert [len(v) for v in series.values()] == [3, 3, 3]
    assert result["time_s"]["two"][2] is None and result["cpu_s_q3"]["two"][2] is None
    for name in ("one", "late"):
        for lo, mid, hi in zip(
            *(result[f"time_s{s}"][name] for s in ("_q1", "", "_q3")), strict=True
        ):
            assert 0 <= lo <= mid <= hi
    assert _common.ratio(result, "two", "one")[2] is None
    assert _common.separated_at(result, "two", "one")[2] is None
    assert set(_common.by_point(result["cpu_s"], [4, 8, 16])) == {"4", "8", "16"}


def test_sweep_checks_before_timing_and_probes_only_named_functions():
    import torch

    def contenders(n):
        return {"a": lambda: torch.zeros(n), "b": lambda: torch.ones(n)}

    check = _common.agree("a", "b", atol=0.5)
    with pytest.raises(AssertionError, match="at 3: b differs from a by 1.0"):
        _common.sweep(_fake_run(), [3], contenders, check=check)
    makers = {"a": lambda n: lambda: torch.zeros(n)}
    with pytest.raises(ValueError, match="module-level"):
        _common.sweep(_fake_run(), [3], makers, memory=True)


def test_a_block_times_each_contender_in_its_own_loop():
    calls: list[str] = []

    def fn(name):
        return lambda: calls.append(name)

    fns = {"a": fn("a"), "b": fn("b")}
    wall, cpu = _common.interleaved_clocks(fns, warmup=1, repeat=2, block=3)
    assert {n: len(s) for n, s in wall.items()} == {"a": 6, "b": 6}
    assert {n: len(s) for n, s in cpu.items()} == {"a": 6, "b": 6}
    # warm-up round, then per round: one untimed call and three timed ones in a row
    assert "".join(calls) == "ab" + "aaaabbbb" * 2
    calls.clear()
    _common.interleaved_clocks(fns, warmup=0, repeat=2)  # block=1: round-robin
    assert "".join(calls) == "abab"


def test_fit_slope_skips_missing_values_and_falls_back_to_every_size():
    ns = [256, 512, 1024, 2048, 4096]
    quadratic = [n**2 for n in ns]
    assert math.isclose(_common.fit_slope(ns, quadratic, start=2048), 2.0)
    with_gaps = [None, 512.0, 1024.0, None, None]  # only two sizes measured
    assert math.isclose(_common.fit_slope(ns, with_gaps, start=2048), 1.0)
    assert _common.fit_slope(ns, [None, None, 1.0, None, None]) is None
    assert _common.local_slopes(ns, quadratic, start=1024) == pytest.approx([2.0, 2.0])
    floored = _common.fit_slope([1, 10], [0.0, 1.0], floor=0.1)
    assert math.isclose(floored, 1.0)


@pytest.mark.slow
def test_the_memory_probe_reads_a_fresh_process():
    # A (64, 64) float32 score matrix per head and more: at least a few KiB, well
    # under the 1 GiB a runaway probe would read.
    peak = _common.peak_memory_mib("tiled:make_naive", 512)
    assert 0.5 < peak < 1024, peak


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_quick_run_saves_every_key_of_the_saved_result(name, tmp_path):
    command = [sys.executable, str(BENCH / f"{name}.py"), "--quick", "--allow-loaded"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ.copy(),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    quick = json.loads((tmp_path / f"{name}.json").read_text())
    assert quick["stamp"]["quick"] is True and "quiet" in quick
    saved = RESULTS / f"{name}.json"
    if saved.exists():  # a result the chapters read keeps its keys (add, never rename)
        missing = key_paths(json.loads(saved.read_text())) - key_paths(quick)
        assert not missing, f"{name}.py no longer saves {sorted(missing)}"
