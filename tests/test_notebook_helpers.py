"""report_close: asserts a stated tolerance and prints it, never the rounding error."""

import math

import pytest
import torch

from attention import report_close, setup_notebook


def test_prints_the_bound_not_the_error(capsys):
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    report_close("sum order", x + 1e-15, x, atol=1e-12)
    assert capsys.readouterr().out == "✓ sum order: within 1e-12\n"


@pytest.mark.parametrize(
    ("atol", "rtol", "text"),
    [
        (0.0, 0.0, "exact"),
        (0.0, 1e-6, "within 1e-6 relative"),
        (1e-5, 1e-3, "within 1e-5 + 0.001·|expected|"),
        (0.5, 0.0, "within 0.5"),
    ],
)
def test_wording_of_each_kind_of_bound(capsys, atol, rtol, text):
    report_close("x", torch.ones(3), torch.ones(3), atol=atol, rtol=rtol)
    assert capsys.readouterr().out == f"✓ x: {text}\n"


def test_raises_with_the_measured_difference():
    a = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)
    with pytest.raises(
        AssertionError,
        match=r"1 of 3 values differ.*largest difference 1\.000e-03 at index \(2,\)",
    ):
        report_close(
            "x", a + torch.tensor([0.0, 0.0, 1e-3], dtype=torch.float64), a, atol=1e-4
        )


def test_relative_bound_scales_with_expected():
    report_close(
        "big", torch.tensor([1e6 + 1.0]), torch.tensor([1e6]), atol=0.0, rtol=1e-5
    )
    with pytest.raises(AssertionError):
        report_close(
            "small", torch.tensor([2.0]), torch.tensor([1.0]), atol=0.0, rtol=1e-5
        )


def test_nan_matches_only_nan_and_inf_only_the_same_inf():
    nan, inf = math.nan, math.inf
    report_close(
        "nan", torch.tensor([nan, inf, -inf]), torch.tensor([nan, inf, -inf]), atol=0.0
    )
    with pytest.raises(AssertionError):
        report_close("nan vs 0", torch.tensor([nan]), torch.tensor([0.0]), atol=1.0)
    with pytest.raises(AssertionError):
        report_close("inf vs -inf", torch.tensor([inf]), torch.tensor([-inf]), atol=1.0)


def test_numbers_and_broadcasting():
    report_close("scalar", 0.1 + 0.2, 0.3, atol=1e-15)
    report_close("broadcast", torch.zeros(2, 3), 0.0, atol=0.0)
    with pytest.raises(ValueError, match="do not broadcast"):
        report_close("shapes", torch.zeros(2), torch.zeros(3), atol=1.0)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"atol": -1.0}, ValueError, "atol must be finite and >= 0"),
        ({"atol": math.nan}, ValueError, "atol must be finite"),
        ({"atol": 0.0, "rtol": True}, TypeError, "rtol must be a number"),
        ({"atol": "1e-6"}, TypeError, "atol must be a number"),
        ({"atol": 10**400}, ValueError, "atol must be a number a float can hold"),
    ],
)
def test_bad_tolerances(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        report_close("x", torch.zeros(1), torch.zeros(1), **kwargs)


@pytest.mark.parametrize("which", ["actual", "expected"])
def test_a_meta_tensor_has_no_values_to_compare(which):
    meta, values = torch.empty(3, device="meta"), torch.zeros(3)
    args = {"actual": values, "expected": values} | {which: meta}
    with pytest.raises(
        ValueError,
        match=f"{which} must hold values to be checked, got a tensor on the meta "
        "device",
    ):
        report_close("x", args["actual"], args["expected"], atol=1.0)


def test_tolerance_is_required():
    with pytest.raises(TypeError):
        report_close("x", torch.zeros(1), torch.zeros(1))  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"threads": 0}, ValueError, "threads must be >= 1"),
        ({"seed": -1}, ValueError, "seed must be >= 0"),
        ({"precision": 2.5}, TypeError, "precision must be an int"),
        ({"threads": True}, TypeError, "threads must be an int"),
    ],
)
def test_setup_notebook_refuses_bad_input_before_changing_state(kwargs, exc, match):
    before = torch.get_num_threads()
    with pytest.raises(exc, match=match):
        setup_notebook(**kwargs)
    assert torch.get_num_threads() == before


def test_python_floats_are_compared_in_float64():
    import math as _m

    report_close(
        "exp", _m.exp(2.0), 7.38905609893065, atol=1e-13
    )  # float32 would miss by 2e-7
    with pytest.raises(AssertionError):
        report_close("exp", _m.exp(2.0), 7.389056, atol=1e-9)


# ---------------------------------------------------------------- benchmark_machine


def test_benchmark_machine_names_every_field_of_a_protocol_stamp():
    from attention import benchmark_machine

    result = {
        "stamp": {
            "cpu": "Test CPU",
            "cores": 2,
            "threads": 1,
            "memory_threads": 1,
            "omp_wait_policy": "passive",
            "torch": "9.9",
            "date": "2030-01-02",
            "datetime": "2030-01-02T03:04Z",
            "load_1min_before": 0.25,
            "load_1min_after": 3.5,
        },
        "quiet": False,
    }
    assert benchmark_machine(result) == (
        "Test CPU, 2 cores, 1 thread (memory: 1), OpenMP passive, torch 9.9, "
        "2030-01-02 03:04 UTC, load 0.25 -> 3.50 (NOT quiet)"
    )


def test_benchmark_machine_reads_older_stamps():
    from attention import benchmark_machine

    old = {
        "stamp": {
            "cpu": "Old",
            "cores": 4,
            "threads": 2,
            "torch": "1.0",
            "date": "2020-01-01",
        },
        "load_average": [1.0, 2.0, 3.0],
        "config": {"omp_wait_policy": "PASSIVE"},
    }
    assert (
        benchmark_machine(old)
        == "Old, 4 cores, 2 threads, OpenMP passive, torch 1.0, 2020-01-01, "
        "load 1.00 -> ? (quiet)"
    )
    bare = {
        "stamp": {
            "cpu": "Bare",
            "cores": 2,
            "threads": 1,
            "torch": "1.0",
            "date": "2020-01-01",
        }
    }
    assert benchmark_machine(bare).endswith("load not recorded")


def test_benchmark_machine_on_every_shipped_result():
    from attention import benchmark_machine, load_benchmark
    from attention.course.notebook import resources

    folder = resources.files("attention") / "benchmark_results"
    for name in sorted(
        p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json")
    ):
        line = benchmark_machine(name)
        assert str(load_benchmark(name)["stamp"]["cpu"]) in line and "cores" in line


@pytest.mark.parametrize(
    ("arg", "exc", "match"),
    [
        (3, TypeError, "benchmark name"),
        ({"no": "stamp"}, ValueError, "stamp"),
        ("nope", ValueError, "no saved"),
    ],
)
def test_benchmark_machine_refuses(arg, exc, match):
    from attention import benchmark_machine

    with pytest.raises(exc, match=match):
        benchmark_machine(arg)
