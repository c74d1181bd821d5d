"""The facade, attention/__init__.py: exactly the union of the re-exported modules' __all__."""

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import attention

INIT = Path(attention.__file__).read_text()
REEXPORTED = re.findall(r"^from \.(\w+) import \*", INIT, flags=re.MULTILINE)
# modules a reader imports by path: one chapter's toolkit, not part of the library
STANDALONE = {"seq2seq", "triton_flash"}  # triton_flash needs the optional Triton


def _module(name):
    return importlib.import_module(f"attention.{name}")


def test_every_public_module_is_reexported_or_standalone():
    public = {m.name for m in pkgutil.iter_modules(attention.__path__) if not m.name.startswith("_")}
    assert set(REEXPORTED) | STANDALONE == public
    assert not set(REEXPORTED) & STANDALONE


def test_facade_is_the_union_of_the_modules_all_in_reading_order():
    expected = [name for m in REEXPORTED for name in _module(m).__all__]
    assert attention.__all__ == expected


def test_no_duplicates_and_at_most_75_names():
    names = attention.__all__
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert len(names) <= 75


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
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert inspect.getdoc(obj), f"{name} has no docstring"


def test_every_module_names_its_chapter():
    for m in [*REEXPORTED, *STANDALONE]:
        doc = _module(m).__doc__ or ""
        assert re.search(r"chapters? \d\d", doc) or m in {"notebook", "plotting"}, m
