"""The landing page's map of the chapters (scripts/chapter_map.py) matches _toc.yml."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"


def _script():
    spec = importlib.util.spec_from_file_location(
        "chapter_map", ROOT / "scripts" / "chapter_map.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def toc_chapters() -> list[str]:
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [
        Path(c["file"]).name
        for part in toc["parts"]
        for c in part.get("chapters", [])
        if c["file"].startswith("chapters/")
    ]


def test_the_committed_map_is_drawn_from_the_current_table_of_contents():
    cm = _script()
    assert cm.OUT.read_text() == cm.render(cm.chapter_parts()), (
        "book/_static/chapter_map.svg is out of date: run scripts/chapter_map.py"
    )


def test_every_chapter_of_the_table_of_contents_is_on_the_map_with_its_number():
    tree = ET.parse(_script().OUT)
    boxes = [
        (g.get("data-chapter"), int(g.get("data-number")))
        for g in tree.iter(f"{SVG}g")
        if g.get("data-chapter")
    ]
    chapters = toc_chapters()
    assert [stem for stem, _ in boxes] == chapters
    assert [n for _, n in boxes] == list(range(1, len(chapters) + 1))
    labels = [
        t.text
        for g in tree.iter(f"{SVG}g")
        if g.get("data-chapter")
        for t in g.iter(f"{SVG}text")
    ]
    assert all(label and label.strip() for label in labels)


def test_every_prerequisite_comes_earlier_in_the_book():
    cm = _script()
    order = {cm.name_of(stem): k for k, stem in enumerate(toc_chapters())}
    assert set(cm.PREREQUISITES) | {
        s for v in cm.PREREQUISITES.values() for s in v
    } <= set(cm.SHORT)
    for target, sources in cm.PREREQUISITES.items():
        for source in sources:
            if source in order and target in order:
                assert order[source] < order[target], (
                    f"{target} builds on later {source}"
                )


def test_a_prerequisite_that_is_not_an_arrow_is_named_on_its_box():
    cm = _script()
    parts = [
        ("A", ["01_dot_product", "02_softmax", "03_masking"]),
        ("B", ["04_self_attention"]),
        ("C", ["05_linear_attention"]),
        ("D", ["06_beyond_softmax"]),
    ]
    svg = cm.render(parts)
    # down the first column: 1 -> 2 (arrow); masking builds on softmax, the box above
    # it; self-attention on masking, one column on; linear attention on self-attention
    assert svg.count('class="edge"') == 4
    # beyond softmax builds on self-attention, two columns back: named, not drawn
    assert "Chapter 6 · after 4</text>" in svg
    assert "Chapter 5</text>" in svg
