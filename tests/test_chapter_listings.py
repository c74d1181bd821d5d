"""The package source a chapter shows with ``{literalinclude}``: found, readable, and
highlighted where the prose says.

A chapter that reads the package's code line by line (chapter 16 reads the Triton
kernels) shows it as a MyST ``{literalinclude}`` in a markdown cell: highlighted, with
the file's line numbers (``:lineno-match:``) and the lines the prose discusses
emphasised (``:emphasize-lines:``, counted within the shown snippet). The snippet is
resolved here exactly as the book's build resolves it, by Sphinx's own
``LiteralIncludeReader``, so an edit of the source that shifts or renames a discussed
line fails a test instead of silently emphasising another line:

- every listing finds its file and object, numbers its lines and emphasises some;
- every shown line fits the code column beside its line number (84 characters);
- the discussion after a listing (the rest of its cell) quotes, in inline code, a
  statement of every emphasised line (a span of at least 10 characters found in it);
- every quote of the discussion that is found in the snippet is found in an emphasised
  line: the prose discusses no line that is not highlighted;
- a quote that opens a bullet or a paragraph of the discussion (the line being read)
  is found in the snippet: prose about a line that was since rewritten fails;
- no chapter copies a kernel's source into a code cell or prints it
  (``inspect.getsource``): the listings are the only copy, and they are the file.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from sphinx.config import Config
from sphinx.directives.code import LiteralIncludeReader
from sphinx.util import parselinenos

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
#: The code column holds 88 characters; a line number and its gap take up to 4.
MAX_SHOWN = 84
#: A quote this long, found in an emphasised line, counts as discussing it.
MIN_QUOTE = 10

DIRECTIVE = re.compile(
    r"^(?P<fence>`{3,}|:{3,})\{literalinclude\}[ \t]+(?P<path>\S+)[ \t]*\n"
    r"(?P<options>(?:[ \t]*:[\w-]+:.*\n)*)"
    r"(?P=fence)[ \t]*$",
    flags=re.M,
)


@dataclass
class Listing:
    chapter: str
    cell: int
    path: Path
    options: dict
    discussion: str

    def __str__(self) -> str:
        where = self.options.get("pyobject", self.path.name)
        return f"{self.chapter} cell {self.cell}: {where}"


def listings() -> list[Listing]:
    found = []
    for chapter in CHAPTERS:
        cells = json.loads(chapter.read_text(encoding="utf-8"))["cells"]
        for n, cell in enumerate(cells):
            if cell["cell_type"] != "markdown":
                continue
            text = "".join(cell["source"])
            matches = list(DIRECTIVE.finditer(text))
            for k, m in enumerate(matches):
                options = {}
                for line in m.group("options").splitlines():
                    key, _, value = line.strip()[1:].partition(":")
                    options[key] = value.strip() or True
                end = matches[k + 1].start() if k + 1 < len(matches) else len(text)
                path = (chapter.parent / m.group("path")).resolve()
                found.append(
                    Listing(chapter.stem, n, path, options, text[m.end() : end])
                )
    return found


LISTINGS = listings()


def snippet(listing: Listing) -> tuple[list[str], list[str]]:
    """``(all shown lines, emphasised lines)``, as Sphinx builds them."""
    reader = LiteralIncludeReader(str(listing.path), listing.options, Config())
    lines = reader.read()[0].splitlines()
    marked = parselinenos(listing.options.get("emphasize-lines", ""), len(lines))
    return lines, [lines[k] for k in marked]


def squeeze(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def quotes(text: str) -> list[str]:
    """The inline code spans of a markdown text (fenced blocks and math left out)."""
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)
    return [squeeze(q) for q in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)]


def test_chapter_16_reads_its_kernels_from_the_package():
    shown = {
        listing.options.get("pyobject")
        for listing in LISTINGS
        if listing.chapter == "16_triton_flash"
    }
    assert {
        "flash_forward_block",
        "flash_forward_kernel",
        "flash_backward_dkdv_kernel",
    } <= shown


@pytest.mark.parametrize("listing", LISTINGS, ids=str)
def test_a_listing_is_found_numbered_and_emphasised(listing):
    assert listing.path.is_file(), f"{listing}: no file {listing.path}"
    assert listing.path.is_relative_to(ROOT / "src"), "listings show the package"
    assert "lineno-match" in listing.options, f"{listing}: line numbers of the file"
    assert "emphasize-lines" in listing.options, f"{listing}: emphasise what is read"
    lines, marked = snippet(listing)
    assert lines and marked, f"{listing}: nothing shown or nothing emphasised"


@pytest.mark.parametrize("listing", LISTINGS, ids=str)
def test_every_shown_line_fits_beside_its_line_number(listing):
    lines, _ = snippet(listing)
    wide = [line for line in lines if len(line) > MAX_SHOWN]
    assert not wide, f"{listing}: {len(wide)} lines over {MAX_SHOWN}: {wide[0]!r}"


@pytest.mark.parametrize("listing", LISTINGS, ids=str)
def test_the_prose_quotes_every_emphasised_line(listing):
    _, marked = snippet(listing)
    said = [q for q in quotes(listing.discussion) if len(q) >= MIN_QUOTE]
    silent = [line for line in marked if not any(q in squeeze(line) for q in said)]
    assert not silent, (
        f"{listing}: emphasised lines that the prose after it never quotes: "
        f"{[line.strip() for line in silent]}"
    )


@pytest.mark.parametrize("listing", LISTINGS, ids=str)
def test_every_line_the_prose_quotes_is_emphasised(listing):
    lines, marked = snippet(listing)
    stray = [
        q
        for q in quotes(listing.discussion)
        if any(q in squeeze(line) for line in lines)
        and not any(q in squeeze(line) for line in marked)
    ]
    assert not stray, (
        f"{listing}: the prose quotes {stray}, which is shown but not emphasised"
    )


def leading_quotes(text: str) -> list[str]:
    """The inline code span that opens each bullet or paragraph of a discussion."""
    found = re.findall(r"(?:^|\n\n|\n[-*] )`([^`\n]+)`", text)
    return [squeeze(q) for q in found]


@pytest.mark.parametrize("listing", LISTINGS, ids=str)
def test_every_line_the_prose_reads_is_in_the_source(listing):
    lines, _ = snippet(listing)
    shown = [squeeze(line) for line in lines]
    stale = [
        q for q in leading_quotes(listing.discussion) if not any(q in s for s in shown)
    ]
    assert not stale, f"{listing}: the prose reads {stale}, which the source lacks"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_copies_or_prints_package_source(chapter):
    cells = json.loads(chapter.read_text(encoding="utf-8"))["cells"]
    copied = [
        n
        for n, cell in enumerate(cells)
        if cell["cell_type"] == "code"
        and any(s in "".join(cell["source"]) for s in ("@triton.jit", "getsource("))
    ]
    assert not copied, f"{chapter.stem}: cells {copied} copy or print source"


def test_the_quote_rules_catch_a_shifted_emphasis(tmp_path):
    """Emphasising the line after the discussed one fails both rules."""
    source = tmp_path / "kernel.py"
    source.write_text("def f(x):\n    y = x + 100\n    z = y * 2\n    return z\n")
    listing = Listing(
        "test",
        0,
        source,
        {"pyobject": "f", "lineno-match": True, "emphasize-lines": "3"},
        "- `y = x + 100` adds a hundred.\n",
    )
    _, marked = snippet(listing)
    assert [line.strip() for line in marked] == ["z = y * 2"]
    said = [q for q in quotes(listing.discussion) if len(q) >= MIN_QUOTE]
    assert not any(q in squeeze(line) for q in said for line in marked)
    listing.options["emphasize-lines"] = "2"
    _, marked = snippet(listing)
    assert any(q in squeeze(line) for q in said for line in marked)


def test_a_rewritten_line_leaves_a_stale_quote(tmp_path):
    """The discussion reads a line the source no longer has: the quote is found."""
    source = tmp_path / "kernel.py"
    source.write_text("def f(x):\n    y = x + 200\n    return y\n")
    text = "Intro.\n\n- `y = x + 100` adds a hundred.\n- `return y` ends.\n"
    assert leading_quotes(text) == ["y = x + 100", "return y"]
    listing = Listing(
        "test", 0, source, {"pyobject": "f", "emphasize-lines": "2"}, text
    )
    lines, _ = snippet(listing)
    assert not any("y = x + 100" in squeeze(line) for line in lines)


def test_the_directive_pattern_reads_a_listing():
    text = (
        "Intro.\n\n```{literalinclude} ../src/x.py\n:pyobject: f\n:lineno-match:\n"
        ":emphasize-lines: 2,3\n```\n\n- `y = 1`\n"
    )
    m = DIRECTIVE.search(text)
    assert m and m.group("path") == "../src/x.py"
    assert ":emphasize-lines: 2,3" in m.group("options")
