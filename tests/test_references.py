"""book/references.bib: every entry can be found, and the book lists it as the text
cites it.

The bibliography's labels come from the pybtex style that book/_ext/course_html.py
registers ("Vaswani et al., 2017", the form of the author-year citations in the text);
the built book's labels and citations are compared in tests/browser/test_reading.py.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pybtex = pytest.importorskip("pybtex")

ROOT = Path(__file__).resolve().parents[1]
BIB = ROOT / "book" / "references.bib"


def entries():
    from pybtex.database import parse_file

    return parse_file(str(BIB)).entries


def extension():
    spec = importlib.util.spec_from_file_location(
        "course_html", ROOT / "book" / "_ext" / "course_html.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_entry_has_a_doi_or_a_url():
    missing, malformed = [], []
    for key, entry in entries().items():
        fields = {name.lower(): value for name, value in entry.fields.items()}
        if "doi" not in fields and "url" not in fields:
            missing.append(key)
        if "doi" in fields and not re.fullmatch(r"10\.\d{4,9}/\S+", fields["doi"]):
            malformed.append(f"{key}: doi {fields['doi']!r}")
        if "url" in fields and not re.fullmatch(r"https://\S+", fields["url"]):
            malformed.append(f"{key}: url {fields['url']!r}")
    assert missing == [], f"entries without a DOI or URL: {missing}"
    assert malformed == [], "\n".join(malformed)


def test_no_entry_holds_tex_math_that_the_html_would_show_raw():
    raw = [
        f"{key}: {name}"
        for key, entry in entries().items()
        for name, value in entry.fields.items()
        if "$" in value or "\\(" in value
    ]
    assert raw == []


def test_labels_are_author_year_and_unique():
    from pybtex.plugin import find_plugin

    extension()._register_bibliography_style()
    style = find_plugin("pybtex.style.formatting", "course_author_year")()
    formatted = list(style.format_entries(style.sort(entries().values())))
    labels = [e.label for e in formatted]
    assert len(set(labels)) == len(labels) == len(entries())
    for label in labels:
        assert re.fullmatch(r"[^\[\]{}+]+, (\d{4}|n\.d\.)[a-z]?", label), label
    by_key = {e.key: e.label for e in formatted}
    assert by_key["vaswani2017attention"] == "Vaswani et al., 2017"
    assert by_key["raschka2023selfattention"] == "Raschka, 2023"
    assert by_key["jain2019attention"] == "Jain and Wallace, 2019"
    # "and others" after one named author is still "et al.", as in the text
    assert by_key["choromanski2021rethinking"] == "Choromanski et al., 2021"


def test_a_tab_title_holds_no_tex():
    tex_as_text = extension().tex_as_text
    assert tex_as_text(r"\sqrt{d_k}") == "√d_k"
    assert tex_as_text(r"O(N \cdot d^2)") == "O(N · d^2)"
    assert tex_as_text(r"\mathrm{softmax}(x)") == "softmax(x)"
