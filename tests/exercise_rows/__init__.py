"""The rows of tests/test_exercises.py, one module per chapter (``chNN.py``, each with
its ``ROWS``), so that chapters add their checkers without touching each other's."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One checker and the reader's functions it is tried on."""

    checker: Callable
    solution: Callable
    stub: Callable
    wrong: tuple[
        tuple[Callable, str], ...
    ]  # (wrong solution, expected message fragment)


def all_rows() -> list[Row]:
    """Every chapter module's ``ROWS``, in chapter order."""
    rows = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("ch"):
            rows += importlib.import_module(f"{__name__}.{info.name}").ROWS
    return rows
