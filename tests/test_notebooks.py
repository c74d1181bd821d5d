"""Structural checks of the chapter notebooks that nbval alone would not catch.

nbval compares only cells that were executed, so a notebook stored without outputs would
pass silently; these tests fail instead. They also check that every chapter is in the
book's table of contents and ends with exercises whose solutions assert something.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]


def load(path):
    return json.loads(path.read_text())


def test_there_are_chapters():
    assert len(CHAPTERS) >= 4


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_stored_executed_top_to_bottom(path):
    counts = [c.get("execution_count") for c in code_cells(load(path))]
    assert None not in counts, f"{path.name}: {counts.count(None)} code cells stored unexecuted"
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..n; re-run it top to bottom in a fresh kernel"
    )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_outputs_are_clean(path):
    for n, cell in enumerate(code_cells(load(path))):
        tags = cell.get("metadata", {}).get("tags", [])
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error" or "raises-exception" in tags, (
                f"{path.name} cell {n}: stored error output"
            )
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            assert not re.search(r" at 0x[0-9a-f]+", text), f"{path.name} cell {n}: memory address in output"
            assert "/work/" not in text and "/home/" not in text and "site-packages" not in text, (
                f"{path.name} cell {n}: an absolute path in an output differs between machines"
            )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_single_title_and_no_skipped_heading_levels(path):
    levels = []
    for cell in load(path)["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        in_fence = False
        for line in "".join(cell["source"]).splitlines():
            if line.lstrip().startswith(("```", ":::")):
                in_fence = not in_fence
            m = re.match(r"^(#{1,6}) ", line)
            if m and not in_fence:
                levels.append(len(m.group(1)))
    assert levels and levels[0] == 1 and levels.count(1) == 1, f"{path.name}: needs exactly one '#' title, first"
    for a, b in zip(levels, levels[1:]):
        assert b <= a + 1, f"{path.name}: heading level jumps from {a} to {b}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_ends_with_exercises_whose_solutions_are_checked(path):
    cells = load(path)["cells"]
    starts = [n for n, c in enumerate(cells)
              if c["cell_type"] == "markdown" and re.search(r"^## Exercises", "".join(c["source"]), re.M)]
    assert starts, f"{path.name}: no '## Exercises' section"
    solutions = [c for c in cells[starts[-1]:]
                 if c["cell_type"] == "code" and "hide-cell" in c.get("metadata", {}).get("tags", [])]
    assert len(solutions) >= 2, f"{path.name}: fewer than 2 solution cells tagged hide-cell"
    for c in solutions:
        assert re.search(r"\bassert\b|assert_close", "".join(c["source"])), (
            f"{path.name}: a solution cell checks nothing"
        )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_small_enough_to_review(path):
    assert path.stat().st_size < 2_000_000


def test_every_chapter_is_in_the_table_of_contents_and_vice_versa():
    toc = (ROOT / "_toc.yml").read_text()
    listed = set(re.findall(r"file:\s*chapters/(\S+)", toc))
    on_disk = {p.stem for p in CHAPTERS}
    assert listed == on_disk
