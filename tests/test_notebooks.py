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
    return [
        c
        for c in nb["cells"]
        if c["cell_type"] == "code" and "".join(c["source"]).strip()
    ]


def load(path):
    return json.loads(path.read_text())


def test_there_are_chapters():
    assert len(CHAPTERS) >= 4


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_stored_executed_top_to_bottom(path):
    counts = [c.get("execution_count") for c in code_cells(load(path))]
    assert None not in counts, (
        f"{path.name}: {counts.count(None)} code cells stored unexecuted"
    )
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..n; re-run it top to "
        "bottom in a fresh kernel"
    )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_outputs_are_clean(path):
    for n, cell in enumerate(code_cells(load(path))):
        tags = cell.get("metadata", {}).get("tags", [])
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error" or "raises-exception" in tags, (
                f"{path.name} cell {n}: stored error output"
            )
            text = "".join(out.get("text", "")) + "".join(
                out.get("data", {}).get("text/plain", "")
            )
            assert not re.search(r" at 0x[0-9a-f]+", text), (
                f"{path.name} cell {n}: memory address in output"
            )
            assert (
                "/work/" not in text
                and "/home/" not in text
                and "site-packages" not in text
            ), (
                f"{path.name} cell {n}: an absolute path in an output differs "
                "between machines"
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
    assert levels and levels[0] == 1 and levels.count(1) == 1, (
        f"{path.name}: needs exactly one '#' title, first"
    )
    for a, b in zip(levels, levels[1:]):
        assert b <= a + 1, f"{path.name}: heading level jumps from {a} to {b}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_ends_with_exercises_whose_solutions_are_checked(path):
    cells = load(path)["cells"]
    starts = [
        n
        for n, c in enumerate(cells)
        if c["cell_type"] == "markdown"
        and re.search(r"^## Exercises", "".join(c["source"]), re.M)
    ]
    assert starts, f"{path.name}: no '## Exercises' section"
    solutions = [
        n
        for n, c in enumerate(cells)
        if n > starts[-1]
        and c["cell_type"] == "code"
        and "hide-cell" in c.get("metadata", {}).get("tags", [])
    ]
    assert len(solutions) >= 2, (
        f"{path.name}: fewer than 2 solution cells tagged hide-cell"
    )
    for n in solutions:
        # a function the reader writes (tagged solution) is checked by the next cell's
        # checker (tests/test_chapter_structure.py); any other solution asserts its
        # answer
        written = "solution" in cells[n].get("metadata", {}).get("tags", [])
        checked = (
            "".join(cells[n + 1]["source"]) if written and n + 1 < len(cells) else ""
        )
        assert (
            re.search(r"\bcheck_\w+\(", checked)
            if written
            else re.search(
                r"\bassert\b|assert_close|report_close", "".join(cells[n]["source"])
            )
        ), f"{path.name}: a solution cell checks nothing"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_small_enough_to_review(path):
    assert path.stat().st_size < 2_000_000


def test_every_chapter_is_in_the_table_of_contents_and_vice_versa():
    toc = (ROOT / "_toc.yml").read_text()
    listed = set(re.findall(r"file:\s*chapters/(\S+)", toc))
    on_disk = {p.stem for p in CHAPTERS}
    assert listed == on_disk


# --- Outputs that are the same on every machine ---------------------------------------
# A compared output (a cell not tagged nbval-ignore-output) must not depend on the CPU,
# the BLAS code path, the thread count or flush-to-zero. These patterns catch what does.
ROUNDING_ERROR = re.compile(
    r"(?<![\w.])\d\.\d+e-(0[5-9]|[1-9]\d)\b"
)  # 6.66e-16, 4.8e-07
TINY_LITERAL = re.compile(
    r"(?<![\w.])\d+(?:\.\d+)?e-(3[89]|[4-9]\d|\d{3})\b"
)  # float32 subnormals and below
ADDRESS = re.compile(r"\b0x[0-9a-fA-F]{6,}\b")


def compared_texts(nb):
    """(cell index, text) of every text output that nbval compares."""
    for n, cell in enumerate(code_cells(nb)):
        if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue
        for out in cell.get("outputs", []):
            yield (
                n,
                "".join(out.get("text", ""))
                + "".join(out.get("data", {}).get("text/plain", "")),
            )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_compared_outputs_hold_no_machine_dependent_numbers(path):
    for n, text in compared_texts(load(path)):
        for what, pattern in (
            ("a raw rounding-error-sized number", ROUNDING_ERROR),
            ("a subnormal-sized number", TINY_LITERAL),
            ("a memory address", ADDRESS),
        ):
            hit = pattern.search(text)
            assert hit is None, (
                f"{path.name} code cell {n} prints {what} ({hit.group()}): it "
                "changes with the CPU or summation order; print the bound you assert "
                "(attention.report_close)"
            )


def test_the_pattern_catches_what_it_should():
    assert ROUNDING_ERROR.search("max |a - b| = 6.66e-16")
    assert ROUNDING_ERROR.search("asymmetry 4.8e-07")
    assert TINY_LITERAL.search("smallest weight 8.194e-40")
    assert TINY_LITERAL.search("2.34e-43")
    assert ADDRESS.search("<Figure at 0x7f3a2b1c9d90>")
    assert not ROUNDING_ERROR.search(
        "agree within 1e-12"
    )  # a stated bound, no mantissa
    assert not ROUNDING_ERROR.search("lr = 3.0e-03")
    assert not TINY_LITERAL.search("agree within 1e-12")


# --- Figures sized for the column and sharp on high-density screens -------------------
COLUMN_CSS_PX = 750  # the book's content column
MIN_DENSITY = 1.5  # device pixels per CSS pixel


def stored_pngs(nb):
    import base64
    import struct

    for n, cell in enumerate(code_cells(nb)):
        for out in cell.get("outputs", []):
            png = out.get("data", {}).get("image/png")
            if png:
                raw = base64.b64decode(png)
                width = struct.unpack(">I", raw[16:20])[0]
                meta = out.get("metadata", {}).get("image/png", {})
                css = meta.get("width", width) if isinstance(meta, dict) else width
                yield n, width, css


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_figures_fit_the_column_and_are_sharp(path):
    for n, width, css in stored_pngs(load(path)):
        assert css <= COLUMN_CSS_PX, (
            f"{path.name} code cell {n}: a figure {css} CSS px wide is shrunk by the "
            f"~{COLUMN_CSS_PX} px column; make it at most 7.5 in wide"
        )
        assert width / css >= MIN_DENSITY, (
            f"{path.name} code cell {n}: {width / css:.1f} device px per CSS px; "
            "store it "
            "retina (setup_notebook does) so it is sharp on high-density screens"
        )


def test_every_chapter_opens_with_the_colab_install_cell():
    """Launched on Colab, a chapter must install the course package before importing
    it."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "colab_cell.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
