"""The two tiers of names, and the facade ``attention/__init__.py`` holding the first.

The rule (CONTRIBUTING.md, "Two tiers of names"): a module's ``__all__`` lists each name
meant for import from it, the library names and the teaching helpers its chapters
import by path; the facade imports the library subset by name, literally, in reading
order, and lists exactly those names in its own ``__all__``. So every name a chapter
imports from a module path (``from attention.layers.scoring import dot_scores``) is in
that module's ``__all__``, and nothing reaches the facade from outside the modules'
``__all__``s.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import pkgutil
import re
from pathlib import Path

import pytest

import attention

INIT = Path(attention.__file__)
ROOT = INIT.parents[2]
# modules a reader imports by path: one chapter's toolkit, not part of the library
# (triton_flash needs the optional Triton); whole subpackages a chapter imports by path:
# the exercise checkers and the conceptual diagrams
STANDALONE = {"layers.seq2seq", "layers.learned_queries", "efficient.triton_flash"}
STANDALONE_PACKAGES = ("exercises.", "course.diagrams.")


def _module(name):
    return importlib.import_module(f"attention.{name}")


def _facade_imports() -> list[tuple[str, list[str]]]:
    """``(module, names)`` of each ``from .module import names`` of the facade."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    return [
        (node.module, [a.name for a in node.names])
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 1
    ]


def _public_modules() -> set[str]:
    """The package's public modules, less the standalone subpackages."""
    public = {
        m.name.removeprefix("attention.")
        for m in pkgutil.walk_packages(attention.__path__, "attention.")
        if not m.ispkg and not any(p.startswith("_") for p in m.name.split("."))
    }
    return {m for m in public if not m.startswith(STANDALONE_PACKAGES)}


def test_the_facade_lists_exactly_what_it_imports_by_name_in_reading_order():
    imported = [name for _, names in _facade_imports() for name in names]
    assert attention.__all__ == imported
    assert len(imported) == len(set(imported)), "a name is imported twice"
    literal = ast.parse(INIT.read_text(encoding="utf-8"))
    assign = next(
        n
        for n in literal.body
        if isinstance(n, ast.Assign) and n.targets[0].id == "__all__"
    )
    assert isinstance(assign.value, ast.List) and all(
        isinstance(e, ast.Constant) for e in assign.value.elts
    ), "__all__ is written literally, so pyright and IDEs read it"


def test_the_facade_reexports_nothing_outside_the_modules_all():
    for module, names in _facade_imports():
        outside = [n for n in names if n not in _module(module).__all__]
        assert not outside, (
            f"the facade imports {outside} from {module}, not in its __all__"
        )


def test_every_public_module_is_reexported_or_standalone():
    reexported = {module for module, _ in _facade_imports()}
    assert reexported | STANDALONE == _public_modules()
    assert not reexported & STANDALONE


def test_every_module_declares_all_and_its_names_exist():
    for m in sorted(_public_modules()):
        module = _module(m)
        assert isinstance(module.__all__, list), m
        assert len(module.__all__) == len(set(module.__all__)), m
        for name in module.__all__:
            assert hasattr(module, name), f"{m}.__all__ names a missing {name}"
            assert not name.startswith("_"), f"{m}.__all__ exports the private {name}"


# ------------------------------------------------------------------------ the chapters


def _chapter_cells() -> list[tuple[str, str]]:
    """``(chapter, source)`` of every code cell, with IPython's magics left out."""
    cells = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                source = "".join(cell["source"])
                lines = source.splitlines()
                kept = [ln for ln in lines if not ln.lstrip().startswith(("%", "!"))]
                cells.append((path.name, "\n".join(kept)))
    return cells


def _path_names(sources: list[str]) -> list[tuple[str, str]]:
    """``(module, name)`` a chapter's cells take from a module path: ``from
    attention.x.y import name``, and ``module.name`` read from a module imported by path
    (``from attention.efficient import triton_flash``, then ``triton_flash.kernel_for``,
    in any later cell)."""
    found, aliases = [], {}
    for source in sources:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "attention."
            ):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if _is_module(full):
                        aliases[alias.asname or alias.name] = full
                    else:
                        found.append((node.module, alias.name))
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("attention.") and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                found.append((aliases[node.value.id], node.attr))
    return found


def _is_module(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:
        return False


def _outside_all(cells) -> list[str]:
    chapters = {}
    for chapter, source in cells:
        chapters.setdefault(chapter, []).append(source)
    problems = []
    for chapter, sources in chapters.items():
        for module, name in _path_names(sources):
            names = getattr(importlib.import_module(module), "__all__", [])
            if name not in names:
                problems.append(f"{chapter}: {module}.{name}")
    return sorted(set(problems))


@pytest.mark.slow  # parses every chapter: make test, not make check
def test_every_name_a_chapter_takes_from_a_module_path_is_in_its_all():
    cells = _chapter_cells()
    if not cells:  # an installed package without the book's sources
        return
    if any("triton_flash" in s for _, s in cells) and not _is_module("triton"):
        cells = [(c, s) for c, s in cells if "triton_flash" not in s]
    problems = _outside_all(cells)
    assert not problems, (
        "chapters take names from module paths that are not in the module's __all__ "
        f"(add them there, or import a library name from the facade): {problems}"
    )


def test_the_chapter_rule_can_fail():
    cells = [
        ("a.ipynb", "from attention.foundations.softmax import softmax_jacobian"),
        ("b.ipynb", "from attention.foundations.softmax import _shift, stable_x"),
        ("c.ipynb", "from attention.foundations import softmax as s\ns.softmax(x)\n"),
        ("d.ipynb", "from attention.foundations import softmax"),
        ("d.ipynb", "softmax.is_empty(x)  # a later cell"),
    ]
    assert _outside_all(cells) == [
        "b.ipynb: attention.foundations.softmax._shift",
        "b.ipynb: attention.foundations.softmax.stable_x",
        "d.ipynb: attention.foundations.softmax.is_empty",
    ]


# Facade names no chapter calls, each kept for a stated reason (the documented API).
LEARNED_SPARSE = "learned sparse attention (chapter 13), equal to fla-core's references"
DOCUMENTED_API = {
    "use_course_style": (
        "the figure style setup_notebook applies, for a reader's own notebook"
    ),
    "RotaryConfig": (
        "the RoPE options of MultiHeadAttention, MultiHeadLatentAttention, "
        "dual_chunk_attention"
    ),
    "LocalAlignment": (
        "the module form of local_alignment (chapter 9), with learned w_p and v_p"
    ),
    "kimi_delta_attention": (
        "the per-channel decay after gated DeltaNet, equal to fla's KDA"
    ),
    "GatedDeltaNet": "Qwen3-Next's linear-attention layer, equal to transformers' own",
    "native_sparse_attention": LEARNED_SPARSE,
    "moba_attention": LEARNED_SPARSE,
    "lightning_index_scores": LEARNED_SPARSE,
    "lightning_indexer": LEARNED_SPARSE,
    "deepseek_sparse_attention": LEARNED_SPARSE,
    "selection_mask": LEARNED_SPARSE,
    "SelectionStats": LEARNED_SPARSE,
    "selection_stats": LEARNED_SPARSE,
}


def test_no_duplicates_and_every_name_is_used_by_a_chapter_or_documented():
    """The facade grows with the chapters: a name earns its place by being used in one
    (or by a stated reason in DOCUMENTED_API), never by a fixed count."""
    text = []
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        text += ["".join(cell["source"]) for cell in cells]  # code and prose
    text += [p.read_text() for p in sorted((ROOT / "chapters").rglob("*.py"))]
    text = "\n".join(text)
    if "setup_notebook" not in text:  # an installed package without the book's sources
        return
    used = set(re.findall(r"\w+", text)) | DOCUMENTED_API.keys()  # whole words
    unused = [n for n in attention.__all__ if n not in used]
    assert not unused, (
        f"facade names no chapter uses and DOCUMENTED_API does not list: {unused}"
    )
    stale = [n for n in DOCUMENTED_API if n not in attention.__all__]
    assert not stale, f"DOCUMENTED_API lists names the facade no longer has: {stale}"


def test_every_exported_name_has_a_docstring():
    for m in sorted(_public_modules() - {"efficient.triton_flash"}):
        module = _module(m)
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj):  # (a constant such as seq2seq.PAD has no docstring)
                assert inspect.getdoc(obj), f"{m}.{name} has no docstring"


def test_every_module_names_its_chapter():
    for m in sorted(_public_modules()):
        doc = _module(m).__doc__ or ""
        assert re.search(r"chapters? \d+", doc) or m in {
            "course.notebook",
            "course.plotting",
        }, m
