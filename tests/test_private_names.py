"""The package's layers, read from its imports: private names stay where they belong.

Two rules (CONTRIBUTING.md, "Package"):

* an underscore name never leaves its file: no ``from .x import _y`` and no ``x._y``
  read from another module of the package, whatever ``x`` is (inside a private module
  ``_x.py`` the shared names are plain, since the module itself is private);
* a part's private module (``attention/efficient/_tiled.py``) is imported only inside
  its part (``attention/efficient/``); the shared private cores at the root
  (``attention/_checks.py``, ``_core.py``, ``_cache.py``, ``_rope.py``) are imported
  from anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attention

PACKAGE = Path(attention.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_private(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return last.startswith("_") and not last.startswith("__")


def _part(dotted: str) -> str:
    """``attention.efficient._tiled`` -> ``attention.efficient``; a root module's part
    is ``attention`` itself."""
    return dotted.rsplit(".", 1)[0]


def _is_module(dotted: str, root: Path) -> bool:
    relative = Path(*dotted.split(".")[1:])
    return (root / relative).with_suffix(".py").exists() or (
        root / relative / "__init__.py"
    ).exists()


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str | None:
    """The absolute module an ``ImportFrom`` reads from (None outside the package)."""
    if node.level == 0:
        module = node.module or ""
        return module if module.split(".")[0] == "attention" else None
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def violations(source: str, importer: str, *, is_package=False, root=PACKAGE) -> list:
    """``(line, rule, what)`` for every private name or module used out of its place."""
    tree = ast.parse(source)
    found, modules = [], {}  # local name -> the package module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source_module = _resolve(importer, is_package, node)
            if source_module is None:
                continue
            for alias in node.names:
                full = f"{source_module}.{alias.name}"
                if _is_module(full, root):  # a module imported by name
                    modules[alias.asname or alias.name] = full
                    target = full
                elif alias.name.startswith("_"):
                    found.append(
                        (node.lineno, "name", f"{alias.name} from {source_module}")
                    )
                    continue
                else:
                    target = source_module
                if _is_private(target) and _part(target) not in (
                    "attention",
                    _part(importer) if not is_package else importer,
                ):
                    found.append((node.lineno, "module", f"{target} into {importer}"))
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "attention":
                    continue
                private = [p for p in alias.name.split(".") if _is_private(p)]
                if private:
                    found.append(
                        (node.lineno, "module", f"{alias.name} into {importer}")
                    )
                if alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _is_private(node.attr)
        ):
            found.append((node.lineno, "name", f"{node.value.id}.{node.attr}"))
    return sorted(set(found))


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_private_names_and_modules_stay_in_their_place(path):
    found = violations(
        path.read_text(encoding="utf-8"),
        _module_name(path),
        is_package=path.name == "__init__.py",
    )
    assert not found, (
        f"{path.relative_to(PACKAGE)}: "
        + "; ".join(f"line {line}: {rule} {what}" for line, rule, what in found)
        + " (an underscore name never leaves its file: make it plain inside a private "
        "module; a part's _x.py is imported only inside its part, shared cores sit at "
        "the root)"
    )


def test_the_rules_can_fail():
    importer = "attention.efficient.sparse"
    assert violations("from ._patterns import check_layout\n", importer) == []
    assert violations("from .._core import _shift, tril_mask\n", importer) == [
        (1, "name", "_shift from attention._core")
    ]
    assert violations("def f():\n    from .tiled import _forward\n", importer) == [
        (2, "name", "_forward from attention.efficient.tiled")
    ]
    assert (
        violations("from . import _sparse_cpu\nfrom .. import _core\n", importer) == []
    )
    assert violations(
        "from ..layers._single_head import check_features\n", importer
    ) == [
        (1, "module", "attention.layers._single_head into attention.efficient.sparse")
    ]
    assert violations("from ..layers import _scoring\n", importer) == [
        (1, "module", "attention.layers._scoring into attention.efficient.sparse")
    ]
    assert violations(
        "from attention.efficient import triton_flash\ntriton_flash._kernel(1)\n",
        importer,
    ) == [(2, "name", "triton_flash._kernel")]
