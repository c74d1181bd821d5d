"""Every checker of attention/exercises/chNN.py, tried on functions a reader writes.

One row of ``ROWS`` per checker: its solution (as the chapter's ``solution`` cell has
it), the stub the workbook makes of it, and at least two typical wrong solutions, each
with a fragment of the message that must name its fault. The tests below run every row:
the checker passes the solution with one ``✓`` line, fails the stub with the stub
message, and fails each wrong solution with a one-line message naming the fault.

To add a checker: write the solution, the stub and the wrong solutions in
``tests/exercise_rows/chNN.py`` (one module per chapter), and its ``Row`` in that
module's ``ROWS``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch

import attention.exercises
from attention.exercises import ExerciseError
from attention.exercises._checker import STUB_MESSAGE
from exercise_rows import Row, all_rows

# --------------------------------------------------------------------------- the table

ROWS = all_rows()


def _id(row: Row) -> str:
    return f"{row.checker.__module__.rsplit('.', 1)[-1]}.{row.checker.__name__}"


WRONG = [(row, fn, fragment) for row in ROWS for fn, fragment in row.wrong]


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_the_checker_passes_its_solution_with_one_line(row, capsys):
    row.checker(row.solution)
    printed = capsys.readouterr().out
    assert (
        printed.startswith(f"✓ {row.solution.__name__}: ") and printed.count("\n") == 1
    )
    assert len(printed.rstrip("\n")) <= 88, f"the ✓ line is over 88 columns: {printed}"


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_the_checker_fails_the_stub_with_the_stub_message(row):
    with pytest.raises(ExerciseError) as caught:
        row.checker(row.stub)
    assert str(caught.value) == STUB_MESSAGE.format(name=row.stub.__name__)


@pytest.mark.parametrize(
    "row, wrong, fragment", WRONG, ids=[f"{_id(r)}-{w.__name__}" for r, w, _ in WRONG]
)
def test_the_checker_names_the_fault_of_a_typical_wrong_solution(row, wrong, fragment):
    with pytest.raises(ExerciseError) as caught:
        row.checker(wrong)
    message = str(caught.value)
    assert "\n" not in message, f"not one line: {message!r}"
    assert fragment in message, f"{fragment!r} not in {message!r}"
    assert message.startswith(wrong.__name__), message


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_every_row_tries_at_least_two_wrong_solutions(row):
    assert len({fn for fn, _ in row.wrong}) >= 2


def _checkers():
    """Every public ``check_*`` function of the ``attention.exercises.chNN`` modules."""
    found = []
    for info in pkgutil.iter_modules(attention.exercises.__path__):
        if not info.name.startswith("ch"):
            continue
        module = importlib.import_module(f"attention.exercises.{info.name}")
        found += [
            getattr(module, name)
            for name in module.__all__
            if name.startswith("check_") and inspect.isfunction(getattr(module, name))
        ]
    return found


def test_every_checker_has_a_row_in_the_table():
    missing = {f"{c.__module__}.{c.__name__}" for c in _checkers()} - {
        f"{r.checker.__module__}.{r.checker.__name__}" for r in ROWS
    }
    assert not missing, f"checkers without a row in tests/test_exercises.py: {missing}"


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_the_checker_is_deterministic(row):
    """The same wrong solution gets the same message twice (seeded inputs)."""
    wrong = row.wrong[0][0]
    messages = []
    for _ in range(2):
        with pytest.raises(ExerciseError) as caught:
            row.checker(wrong)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]


# ------------------------------------------------------------- chapter 2's references


def test_the_online_step_reference_equals_the_direct_normaliser():
    """Steps over the blocks of a row give its max and sum of exp(x - max), computed
    directly; and softmax from that state equals torch.softmax."""
    from attention.exercises.ch02 import _online_step

    g = torch.Generator().manual_seed(0)
    x = 30 * torch.randn(4, 11, generator=g, dtype=torch.float64)
    m = torch.full((4,), float("-inf"), dtype=torch.float64)
    l = torch.zeros(4, dtype=torch.float64)  # noqa: E741
    for start in range(0, 11, 3):
        m, l = _online_step(m, l, x[:, start : start + 3])  # noqa: E741
    top = x.max(-1).values
    torch.testing.assert_close(m, top, rtol=0, atol=0)
    torch.testing.assert_close(
        l, torch.exp(x - top[:, None]).sum(-1), rtol=1e-12, atol=0
    )
    torch.testing.assert_close(
        torch.exp(x - m[:, None]) / l[:, None], torch.softmax(x, -1)
    )
