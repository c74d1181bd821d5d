"""The facade, attention/__init__.py: exactly the union of the re-exported modules' __all__."""

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import attention

INIT = Path(attention.__file__).read_text()
REEXPORTED = list(
    dict.fromkeys(re.findall(r"^from \.([\w.]+) import", INIT, flags=re.M))
)
# modules a reader imports by path: one chapter's toolkit, not part of the library
# (triton_flash needs the optional Triton); whole subpackages a chapter imports by path:
# the exercise checkers and the conceptual diagrams
STANDALONE = {"layers.seq2seq", "efficient.triton_flash"}
STANDALONE_PACKAGES = ("exercises.", "course.diagrams.")


def _module(name):
    return importlib.import_module(f"attention.{name}")


def test_every_public_module_is_reexported_or_standalone():
    public = {
        m.name.removeprefix("attention.")
        for m in pkgutil.walk_packages(attention.__path__, "attention.")
        if not m.ispkg and not any(p.startswith("_") for p in m.name.split("."))
    }
    public = {m for m in public if not m.startswith(STANDALONE_PACKAGES)}
    assert set(REEXPORTED) | STANDALONE == public
    assert not set(REEXPORTED) & STANDALONE


def test_facade_is_the_union_of_the_modules_all_in_reading_order():
    expected = [name for m in REEXPORTED for name in _module(m).__all__]
    assert attention.__all__ == expected


# Facade names no chapter calls, each kept for a stated reason (the documented API).
DOCUMENTED_API = {
    "use_course_style": "the figure style setup_notebook applies, for a reader's own notebook",
    "RotaryConfig": "the RoPE options of MultiHeadAttention, MultiHeadLatentAttention, dual_chunk_attention",
    "LocalAlignment": "the module form of local_alignment (chapter 9), with learned w_p and v_p",
    "kimi_delta_attention": "the per-channel decay after gated DeltaNet, equal to fla's KDA",
    "GatedDeltaNet": "Qwen3-Next's linear-attention layer, equal to transformers' own",
    "native_sparse_attention": "learned sparse attention (chapter 13), equal to fla-core's references",
    "moba_attention": "learned sparse attention (chapter 13), equal to fla-core's references",
    "lightning_index_scores": "learned sparse attention (chapter 13), equal to fla-core's references",
    "lightning_indexer": "learned sparse attention (chapter 13), equal to fla-core's references",
    "deepseek_sparse_attention": "learned sparse attention (chapter 13), equal to fla-core's references",
    "selection_mask": "learned sparse attention (chapter 13), equal to fla-core's references",
    "SelectionStats": "learned sparse attention (chapter 13), equal to fla-core's references",
    "selection_stats": "learned sparse attention (chapter 13), equal to fla-core's references",
}


def _chapter_text() -> str:
    """Every chapter's cells (code and prose) and the scripts they run, as one text."""
    import json

    root = Path(attention.__file__).parents[2]
    text = []
    for path in sorted((root / "chapters").glob("*.ipynb")):
        text += [
            "".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]
        ]
    text += [p.read_text() for p in sorted((root / "chapters").rglob("*.py"))]
    return "\n".join(text)


def test_no_duplicates_and_every_name_is_used_by_a_chapter_or_documented():
    """The facade grows with the chapters: a name earns its place by being used in one
    (or by a stated reason in DOCUMENTED_API), never by a fixed count."""
    names = attention.__all__
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    text = _chapter_text()
    if "setup_notebook" not in text:  # an installed package without the book's sources
        return
    unused = [
        n for n in names if not re.search(rf"\b{n}\b", text) and n not in DOCUMENTED_API
    ]
    assert not unused, (
        f"facade names no chapter uses and DOCUMENTED_API does not list: {unused}"
    )
    stale = [n for n in DOCUMENTED_API if n not in names]
    assert not stale, f"DOCUMENTED_API lists names the facade no longer has: {stale}"


def test_every_module_declares_all_and_its_names_exist():
    for m in [*REEXPORTED, *STANDALONE]:
        module = _module(m)
        assert isinstance(module.__all__, list), m
        for name in module.__all__:
            assert hasattr(module, name), f"{m}.__all__ names a missing {name}"
            assert not name.startswith("_"), f"{m}.__all__ exports the private {name}"


def test_every_exported_name_has_a_docstring():
    for name in attention.__all__:
        obj = getattr(attention, name)
        assert inspect.isfunction(obj) or inspect.isclass(obj) or callable(obj), name
        assert inspect.getdoc(obj), f"{name} has no docstring"


def test_every_module_names_its_chapter():
    for m in [*REEXPORTED, *STANDALONE]:
        doc = _module(m).__doc__ or ""
        assert re.search(r"chapters? \d+", doc) or m in {
            "course.notebook",
            "course.plotting",
        }, m
