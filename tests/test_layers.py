"""The package's layers, read from its imports: a private name never crosses between public modules.

A public module (``attention/name.py``) exposes what its ``__all__`` lists; the unchecked
cores and checks that several modules share live in private modules (``attention/_name.py``).
So ``from .x import _y`` is allowed only when ``x`` is itself private: otherwise one public
module reaches into another's internals, and moving them breaks it silently.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attention

PACKAGE = Path(attention.__file__).parent


def _private_imports(source: str) -> list[tuple[int, str, str]]:
    """``(line, module, name)`` for every ``_name`` imported from a public module of the package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            if node.module is None:  # from . import _sparse_cpu: a private module, fine
                found += [
                    (node.lineno, ".", a.name)
                    for a in node.names
                    if a.name.startswith("_") and not any(PACKAGE.rglob(f"{a.name}.py"))
                ]
                continue
            module = node.module.split(".")[-1]
            if module.startswith("_"):
                continue
            found += [
                (node.lineno, module, a.name)
                for a in node.names
                if a.name.startswith("_")
            ]
        elif isinstance(
            node, ast.Import
        ):  # import attention.layers.positional._x is not used either
            found += [
                (node.lineno, a.name, a.name)
                for a in node.names
                if a.name.startswith("attention.")
                and any(p.startswith("_") for p in a.name.split(".")[1:])
                and not a.name.split(".")[-1].startswith("_")
            ]
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_is_imported_from_a_public_module(path):
    crossings = _private_imports(path.read_text(encoding="utf-8"))
    assert not crossings, (
        f"{path.name} imports private names from public modules: "
        + ", ".join(
            f"line {line}: {name} from .{module}" for line, module, name in crossings
        )
        + "; move the shared code into a private module (attention/_name.py)"
    )


def test_the_rule_can_fail():
    assert _private_imports("from .positional import _apply_rope, apply_rope\n") == [
        (1, "positional", "_apply_rope")
    ]
    assert (
        _private_imports("from ._rope import _apply_rope\nfrom . import _core\n") == []
    )
    assert _private_imports("def f():\n    from .tiled import _forward\n") == [
        (2, "tiled", "_forward")
    ]
