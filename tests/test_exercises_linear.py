"""Chapter 10's checkers accept what their exercises allow, and nothing more.

The linear-attention exercises say that adding eps = 1e-6 to the denominator is
optional: a solution without it passes as well (tests/test_exercises.py tries each
checker on its solution, its stub and its typical wrong solutions).
"""

from __future__ import annotations

import pytest

from attention.exercises import ExerciseError, ch10
from exercise_rows import ch10 as rows10


def test_the_kernel_checker_accepts_a_solution_without_eps(capsys):
    ch10.check_linear_attention(rows10.linear_attention_without_eps)
    assert capsys.readouterr().out.startswith("✓ linear_attention_without_eps: ")


def test_the_kernel_checker_still_names_a_wrong_solution_without_eps():
    with pytest.raises(ExerciseError, match="the normaliser is missing"):
        ch10.check_linear_attention(rows10.linear_attention_without_normaliser)
