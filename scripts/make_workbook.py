"""Write the workbook: each chapter with its exercise solutions turned into stubs.

For every chapter `chapters/NN_name.ipynb` that has at least one code cell tagged
`solution`, this writes `workbook/NN_name.ipynb`: the same cells with every output and
execution count removed, a short note after the title, and each `solution` cell
replaced by a stub. A stub keeps the cell's imports and the `def` line(s) and docstring
of each function (and class) it defines; the body becomes
`raise NotImplementedError("write your solution here")`, and the cell loses its
`solution` and `hide-*` tags, so it shows open in JupyterLab. Every other cell is kept
as it is, including the `hide-cell` solutions of the exercises that are answered by
computing. Chapters without `solution` cells get no workbook file.

A solution cell holds only imports and definitions (anything else would be lost or
would give the answer away): the script stops with the chapter and cell to fix.

The output is deterministic: JSON with sorted keys, no execution counts, no timing
metadata, the chapters' own cell ids, one fixed kernelspec, and the Colab install cell
of `scripts/colab_cell.py` first, so a workbook opens on Colab like a chapter.

    .venv/bin/python scripts/make_workbook.py          # write workbook/
    .venv/bin/python scripts/make_workbook.py --check  # exit 1 naming stale files
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUB_BODY = 'raise NotImplementedError("write your solution here")'
KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
NOTE = (
    "> **Workbook.** This is the chapter with the solutions of its exercises taken "
    "out. Run the cells from the top. At each exercise, replace "
    '`raise NotImplementedError("write your solution here")` with your code and run '
    "the cell below it: the checker prints a line starting with ✓, or says in one "
    'line what is wrong. The book has the solutions, behind "Show solution".'
)


class WorkbookError(Exception):
    """A chapter that cannot become a workbook; the message says where and why."""


def _colab_cell():
    """scripts/colab_cell.py, loaded by path (this script may be imported by tests)."""
    spec = importlib.util.spec_from_file_location(
        "colab_cell", Path(__file__).with_name("colab_cell.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- stubs


def _lines(lines: list[str], first: int, last: int) -> str:
    """Source lines ``first`` ... ``last`` (1-based, inclusive), joined."""
    return "\n".join(lines[first - 1 : last])


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _stub_definition(node, lines: list[str], where: str) -> str:
    """A def (or class) with its header and docstring kept and its body a stub."""
    start = min([d.lineno for d in node.decorator_list] + [node.lineno])
    first = node.body[0]
    if first.lineno == node.lineno:
        raise WorkbookError(
            f"{where}: write the body of {node.name} on its own lines, "
            "not after the colon"
        )
    parts = [_lines(lines, start, first.lineno - 1)]
    body = node.body
    if _is_docstring(first):
        parts.append(_lines(lines, first.lineno, first.end_lineno))
        body = body[1:]
    indent = " " * first.col_offset
    if isinstance(node, ast.ClassDef):
        methods = []
        for item in body:
            if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                raise WorkbookError(
                    f"{where}: class {node.name} may hold only its docstring and "
                    f"methods in a solution cell (line {item.lineno})"
                )
            methods.append(_stub_definition(item, lines, where))
        if not methods:
            methods = [indent + "pass"]
        return "\n".join(parts) + "\n\n" + "\n\n".join(methods)
    return "\n".join(parts + [indent + STUB_BODY])


def stub_source(source: str, where: str = "a solution cell") -> str:
    """The stub of a solution cell's source: imports kept, definitions stubbed.

    Raises:
        WorkbookError: for a cell that is not Python, or that holds statements other
            than imports and definitions.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise WorkbookError(
            f"{where}: a solution cell must be plain Python ({err})"
        ) from None
    lines = source.splitlines()
    blocks: list[tuple[str, str]] = []  # (kind, text)
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            blocks.append(("import", _lines(lines, node.lineno, node.end_lineno)))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            blocks.append(("def", _stub_definition(node, lines, where)))
        else:
            raise WorkbookError(
                f"{where}: a solution cell holds only imports and definitions (def, "
                f"class); move line {node.lineno} to the checker's cell or another cell"
            )
    if not any(kind == "def" for kind, _ in blocks):
        raise WorkbookError(
            f"{where}: a solution cell must define the reader's function"
        )
    text = blocks[0][1]
    for (before, _), (kind, block) in zip(blocks, blocks[1:]):
        text += ("\n" if before == kind == "import" else "\n\n\n") + block
    return text + "\n"


# --------------------------------------------------------------------------- notebooks


def _tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def has_solutions(nb: dict) -> bool:
    """Whether a chapter has a code cell tagged ``solution``: then it has a workbook."""
    return any(c["cell_type"] == "code" and "solution" in _tags(c) for c in nb["cells"])


def _clean(cell: dict, index: int) -> dict:
    """The cell without outputs, execution count or timing metadata; its id kept."""
    out = {
        "cell_type": cell["cell_type"],
        "id": cell.get("id") or f"cell-{index}",
        "metadata": {
            k: v for k, v in cell.get("metadata", {}).items() if k != "execution"
        },
        "source": "".join(cell["source"]),
    }
    if cell["cell_type"] == "code":
        out["execution_count"] = None
        out["outputs"] = []
    elif "attachments" in cell:
        out["attachments"] = copy.deepcopy(cell["attachments"])
    return out


def _stub_cell(cell: dict, where: str) -> dict:
    """A solution cell as the reader gets it: a stub, shown open."""
    cell["source"] = stub_source(cell["source"], where)
    meta = cell["metadata"]
    tags = [
        t for t in meta.pop("tags", []) if t != "solution" and not t.startswith("hide-")
    ]
    if tags:
        meta["tags"] = tags
    meta.pop("mystnb", None)  # the "Show solution" prompts belong to the hidden cell
    return cell


def workbook_notebook(chapter: dict, name: str) -> dict:
    """The workbook version of a chapter notebook (``name`` is for error messages)."""
    colab = _colab_cell()
    cells = []
    for n, cell in enumerate(chapter["cells"]):
        clean = _clean(cell, n)
        if cell["cell_type"] == "code" and "solution" in _tags(cell):
            clean = _stub_cell(clean, f"{name} cell {n}")
        cells.append(clean)
    code = [n for n, c in enumerate(cells) if c["cell_type"] == "code"]
    install = colab.install_cell()
    install["source"] = "".join(install["source"])
    if code and colab.is_install_cell(cells[code[0]]):
        install["id"] = cells[code[0]]["id"]
        cells[code[0]] = install
    else:
        install["id"] = "colab-install"
        cells.insert(code[0] if code else len(cells), install)
    note = {
        "cell_type": "markdown",
        "id": "workbook-note",
        "metadata": {},
        "source": NOTE,
    }
    cells.insert(1 if cells and cells[0]["cell_type"] == "markdown" else 0, note)
    for cell in cells:  # nbformat stores a source as its lines
        cell["source"] = cell["source"].splitlines(keepends=True)
    return {
        "cells": cells,
        "metadata": {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def render(nb: dict) -> str:
    """The notebook as stable JSON: sorted keys, one-space indent, a final newline."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def expected_workbook(chapters: Path) -> dict[str, str]:
    """File name -> text of every workbook notebook the chapters call for."""
    out = {}
    for path in sorted(chapters.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        if has_solutions(nb):
            out[path.name] = render(workbook_notebook(nb, f"chapters/{path.name}"))
    return out


def stale_files(chapters: Path, workbook: Path) -> list[str]:
    """Workbook notebooks that are missing, out of date, or left over from a chapter."""
    expected = expected_workbook(chapters)
    present = {p.name for p in workbook.glob("*.ipynb")} if workbook.is_dir() else set()
    stale = []
    for name, text in expected.items():
        path = workbook / name
        if not path.exists():
            stale.append(f"{name} (missing)")
        elif path.read_text(encoding="utf-8") != text:
            stale.append(f"{name} (out of date)")
    stale += [
        f"{name} (no chapter with solution cells)"
        for name in sorted(present - set(expected))
    ]
    return stale


def write_workbook(chapters: Path, workbook: Path) -> list[str]:
    """Write every workbook notebook, delete the left-over ones; say what changed."""
    expected = expected_workbook(chapters)
    workbook.mkdir(exist_ok=True)
    changed = []
    for name, text in expected.items():
        path = workbook / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(f"wrote {workbook.name}/{name}")
    for path in sorted(workbook.glob("*.ipynb")):
        if path.name not in expected:
            path.unlink()
            changed.append(f"deleted {workbook.name}/{path.name}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--chapters", type=Path, default=ROOT / "chapters")
    parser.add_argument("--workbook", type=Path, default=ROOT / "workbook")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_files(args.chapters, args.workbook)
            if stale:
                print(
                    "the workbook is stale; run `.venv/bin/python "
                    "scripts/make_workbook.py` and commit workbook/: "
                    + ", ".join(stale)
                )
                return 1
            return 0
        for line in write_workbook(args.chapters, args.workbook):
            print(line)
    except WorkbookError as err:
        print(f"make_workbook: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
