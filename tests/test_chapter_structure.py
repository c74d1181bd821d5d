"""The chapter conventions (CONVENTIONS.md), counted over the stored chapters.

Every chapter must have:

- a first markdown cell titled ``# N. Title`` holding an ``In this chapter`` admonition
  (``:class: tip``) with 3 to 5 bullets;
- a ``## Summary`` section (with bullets) right before ``## Exercises``;
- at least 3 exercises the reader writes: a code cell tagged ``solution`` and
  ``hide-cell`` after a ``### Exercise K: ...`` heading, that the workbook generator can
  stub, followed by a cell that calls a checker of ``attention.exercises``;
- diagrams: at least 2 in chapters 1-9, 1 later, each a code cell tagged ``diagram`` and
  ``remove-input`` that draws with ``attention.course.diagrams`` and ends with
  ``plt.show()``;
- alt text (``metadata.mystnb.image.alt``, a sentence) on every cell with an image;
- prose of short sentences: a mean of at most 22 words and none over 45.

The sentence statistics also run as a report, for rewriting:

    .venv/bin/python tests/test_chapter_structure.py --report [chapters/NN_x.ipynb ...]

prints, per chapter, the number of sentences, the mean length, the count over 45 words
and the longest sentences.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))

MEAN_WORDS = 22  # the most words per sentence on average, per chapter
MAX_WORDS = 45  # the most words in any one sentence


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell: dict) -> str:
    return "".join(cell["source"])


def tags(cell: dict) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def number(path: Path) -> int:
    return int(path.name[:2])


# --------------------------------------------------------------------------- headings


def headings(text: str) -> list[tuple[int, str]]:
    """``(level, title)`` of the markdown headings outside code and directive fences."""
    found, fence = [], None
    for line in text.splitlines():
        stripped = line.strip()
        marker = re.match(r"^(`{3,}|~{3,}|:{3,})", stripped)
        if marker and fence is None:
            fence = marker.group(1)[0]
            continue
        if marker and fence == marker.group(1)[0] and stripped.strip(fence) == "":
            fence = None
            continue
        m = re.match(r"^(#{1,6})\s+(.*\S)", line)
        if m and fence is None:
            found.append((len(m.group(1)), m.group(2).strip()))
    return found


def cell_headings(cells: list[dict]) -> list[tuple[int, int, str]]:
    """``(cell index, level, title)`` for every heading of the markdown cells."""
    return [
        (n, level, title)
        for n, cell in enumerate(cells)
        if cell["cell_type"] == "markdown"
        for level, title in headings(source(cell))
    ]


# --------------------------------------------------------------------------- the rules


def rule_in_this_chapter(nb: dict, chapter: int) -> list[str]:
    """``# N. Title`` first, then an ``In this chapter`` tip with 3 to 5 bullets."""
    cells = nb["cells"]
    if not cells or cells[0]["cell_type"] != "markdown":
        return ["the first cell is not a markdown cell"]
    text = source(cells[0])
    problems = []
    if not re.match(rf"# {chapter}\. \S", text):
        problems.append(f"the first cell must start with '# {chapter}. Title'")
    block = re.search(
        r"^(:{3,}|`{3,})\{admonition\}\s*In this chapter\s*\n(.*?)^\1\s*$",
        text,
        flags=re.M | re.S,
    )
    if block is None:
        return problems + [
            "no ':::{admonition} In this chapter' block in the first cell"
        ]
    body = block.group(2)
    if not re.search(r"^:class:\s*tip\s*$", body, flags=re.M):
        problems.append("the 'In this chapter' admonition lacks ':class: tip'")
    bullets = re.findall(r"^[-*] \S", body, flags=re.M)
    if not 3 <= len(bullets) <= 5:
        problems.append(f"'In this chapter' has {len(bullets)} bullets, not 3 to 5")
    return problems


def rule_summary_before_exercises(nb: dict) -> list[str]:
    """``## Summary`` (with bullets) is the section right before ``## Exercises``."""
    cells = nb["cells"]
    level2 = [(n, title) for n, level, title in cell_headings(cells) if level == 2]
    titles = [title for _, title in level2]
    if "Exercises" not in titles:
        return ["no '## Exercises' section"]
    k = titles.index("Exercises")
    if k == 0 or titles[k - 1] != "Summary":
        before = titles[k - 1] if k else "nothing"
        return [f"the section before '## Exercises' is '## {before}', not '## Summary'"]
    start, end = level2[k - 1][0], level2[k][0]
    summary = "\n".join(
        source(c) for c in cells[start : end + 1] if c["cell_type"] == "markdown"
    )
    summary = summary.split("## Summary", 1)[1].split("## Exercises", 1)[0]
    if not re.search(r"^[-*] \S", summary, flags=re.M):
        return ["'## Summary' holds no bullets of what the reader can now do"]
    return []


def _make_workbook():
    spec = importlib.util.spec_from_file_location(
        "make_workbook", ROOT / "scripts" / "make_workbook.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECKER_CALL = re.compile(r"\b(?:ch\d\d\.)?check_\w+\(")


def _missing_checkers(text: str) -> str | None:
    """The first ``chNN.check_x`` called in ``text`` that attention.exercises lacks."""
    for module, name in re.findall(r"\b(ch\d\d)\.(check_\w+)\(", text):
        try:
            found = hasattr(
                importlib.import_module(f"attention.exercises.{module}"), name
            )
        except ImportError:
            found = False
        if not found:
            return f"{module}.{name}"
    return None


def rule_exercises(nb: dict, minimum: int = 3) -> list[str]:
    """At least ``minimum`` exercises the reader writes, each checked by a checker."""
    cells = nb["cells"]
    starts = [
        n
        for n, level, title in cell_headings(cells)
        if (level, title) == (2, "Exercises")
    ]
    if not starts:
        return ["no '## Exercises' section"]
    stub = _make_workbook().stub_source
    imports = any(
        re.search(r"\battention\.exercises\b", source(c))
        for c in cells
        if c["cell_type"] == "code"
    )
    problems, written = [], 0
    for n in range(starts[-1], len(cells)):
        cell = cells[n]
        if cell["cell_type"] != "code" or "solution" not in tags(cell):
            continue
        where = f"cell {n} (tagged solution)"
        if "hide-cell" not in tags(cell):
            problems.append(f"{where} is not tagged hide-cell too")
        heading = next(
            (source(c) for c in reversed(cells[:n]) if c["cell_type"] == "markdown"), ""
        )
        if not re.search(r"^### Exercise \d+: \S", heading, flags=re.M):
            problems.append(f"{where} does not follow a '### Exercise K: ...' heading")
        try:
            stub(source(cell), where)
        except Exception as err:  # the generator's own message says what to change
            problems.append(str(err))
        following = cells[n + 1] if n + 1 < len(cells) else None
        if (
            following is None
            or following["cell_type"] != "code"
            or not (imports and CHECKER_CALL.search(source(following)))
        ):
            problems.append(
                f"{where} is not followed by a cell calling a checker of "
                "attention.exercises"
            )
            continue
        missing = _missing_checkers(source(following))
        if missing:
            problems.append(f"cell {n + 1} calls {missing}, not in attention.exercises")
            continue
        written += 1
    if written < minimum:
        problems.append(
            f"{written} exercises the reader writes, checked; at least {minimum}"
        )
    return problems


def image_cells(nb: dict) -> list[tuple[int, dict]]:
    return [
        (n, c)
        for n, c in enumerate(nb["cells"])
        if c["cell_type"] == "code"
        and any(
            "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {})
            for o in c.get("outputs", [])
        )
    ]


def alt_text(cell: dict):
    image = cell.get("metadata", {}).get("mystnb", {}).get("image", {})
    return image.get("alt") if isinstance(image, dict) else None


def _alt_problem(alt) -> str | None:
    if not isinstance(alt, str) or not alt.strip():
        return "has no alt text (metadata mystnb.image.alt)"
    if re.search(r"\.(png|svg|jpe?g)\b|/", alt) or len(alt.split()) < 4:
        return f"has alt text that is not a sentence saying what it shows: {alt!r}"
    return None


def rule_alt_text(nb: dict) -> list[str]:
    """Every cell with an image output says in its metadata what the image shows."""
    problems = []
    for n, cell in image_cells(nb):
        problem = _alt_problem(alt_text(cell))
        if problem:
            problems.append(f"code cell {n} shows a figure and {problem}")
    return problems


def rule_diagrams(nb: dict, chapter: int) -> list[str]:
    """Enough diagrams, each drawn by attention.course.diagrams without its source."""
    wanted = 2 if chapter <= 9 else 1
    problems, count = [], 0
    for n, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code" or "diagram" not in tags(cell):
            continue
        count += 1
        text = source(cell)
        if "remove-input" not in tags(cell):
            problems.append(f"diagram cell {n} is not tagged remove-input")
        if "diagrams" not in text:
            problems.append(
                f"diagram cell {n} does not draw with attention.course.diagrams"
            )
        if not text.rstrip().endswith("plt.show()"):
            problems.append(f"diagram cell {n} does not end with plt.show()")
        problem = _alt_problem(alt_text(cell))
        if problem:
            problems.append(f"diagram cell {n} {problem}")
    if count < wanted:
        problems.append(
            f"{count} diagram cells (tagged diagram); chapter {chapter} needs {wanted}"
        )
    return problems


# --------------------------------------------------------------------------- sentences

#: MyST directives whose body is prose (the others, code and math, are skipped).
PROSE_DIRECTIVES = {
    "admonition",
    "note",
    "tip",
    "hint",
    "important",
    "warning",
    "caution",
    "attention",
    "danger",
    "error",
    "seealso",
    "dropdown",
    "epigraph",
    "margin",
    "sidebar",
    "topic",
}
#: Abbreviations whose period does not end a sentence (any case), and those that are
#: abbreviations only before a number ("Fig. 2", "No. 3").
ABBREVIATIONS = ["e.g.", "i.e.", "et al.", "cf.", "vs.", "approx.", "resp.", "a.k.a."]
BEFORE_NUMBERS = ["Fig.", "Figs.", "Eq.", "Eqs.", "Sec.", "Ch.", "No.", "p.", "pp."]
_DOT = "\u2024"  # stands in for a period that ends no sentence, restored afterwards


def _inline(text: str) -> str:
    """A unit of prose with its markup reduced to words (code and math count as one)."""
    text = re.sub(r"\{(?:cite|cite:p|cite:ps|cite:t|cite:ts)\}`[^`]*`", "Author", text)
    text = re.sub(r"\{(?:math|eq)\}`[^`]*`", "math", text)
    text = re.sub(
        r"\{[\w:-]+\}`([^`<]*?)\s*(?:<[^>]*>)?`", r"\1", text
    )  # {term}`x <y>`
    text = re.sub(r"(`+)(.+?)\1", "code", text)
    text = re.sub(r"\$[^$]+\$", "math", text)
    text = re.sub(r"\\\((.+?)\\\)", "math", text)
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", text)  # images
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"\[\^[^\]]*\]", "", text)  # footnote references
    text = re.sub(r"<https?://[^>]*>|https?://\S+", " ", text)
    text = re.sub(r"</?[A-Za-z][^>]*>", " ", text)  # HTML tags
    text = re.sub(r"(\*{1,3}|_{2,3})(\S.*?\S|\S)\1", r"\2", text)  # emphasis
    text = text.replace("...", _DOT * 3).replace("…", _DOT * 3)
    for abbreviation in ABBREVIATIONS:
        pattern = r"(?<![\w.])" + re.escape(abbreviation)
        text = re.sub(pattern, lambda m: m.group().replace(".", _DOT), text, flags=re.I)
    for abbreviation in BEFORE_NUMBERS:
        pattern = r"(?<![\w.])" + re.escape(abbreviation) + r"(?=\s*\d)"
        text = re.sub(pattern, lambda m: m.group().replace(".", _DOT), text)
    text = re.sub(r"\betc\.(?=\s*[a-z,;)])", "etc" + _DOT, text)
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(r"^\d+[.)]\s+", "", text)  # a numbered exercise: "**1.** Count ..."


def _display_math(m: re.Match) -> str:
    """A display equation read as the word "math" inside its sentence.

    The sentence ends with it when the equation ends with a period or the text after it
    starts a new sentence (a capital letter after a blank line).
    """
    body = (m.group(2) or m.group(4) or "").strip()
    after = m.string[m.end() :]
    new_sentence = "\n\n" in m.group(0).split("$$")[-1] and after[:1].isupper()
    if body.endswith(".") or new_sentence:
        return " math.\n\n"
    return " math "


def prose_units(markdown: str) -> list[str]:
    """Paragraphs and list items of prose, each a unit that no sentence runs across.

    Skipped: headings, tables, code fences, math blocks, the fence lines, titles and
    options of MyST directives, and the bodies of directives that are not prose.
    """
    markdown = re.sub(
        r"\s*(\$\$(.*?)\$\$|\\begin\{(\w+\*?)\}(.*?)\\end\{\3\})\s*",
        _display_math,
        markdown,
        flags=re.S,
    )
    markdown = re.sub(r"<!--.*?-->", "\n\n", markdown, flags=re.S)
    units, current = [], []
    fences: list[tuple[str, bool]] = []  # (closing marker, body is prose)
    options = False

    def end():
        if current:
            units.append(" ".join(current))
            current.clear()

    for line in markdown.splitlines():
        stripped = line.strip()
        if fences and stripped == fences[-1][0]:
            fences.pop()
            end()
            continue
        opening = re.match(r"^(`{3,}|~{3,}|:{3,})\s*(\{([\w-]+)\})?", stripped)
        if opening:
            end()
            name = opening.group(3)
            prose = name in PROSE_DIRECTIVES and all(p for _, p in fences)
            fences.append((opening.group(1), prose))
            options = True
            continue
        if fences and not fences[-1][1]:
            continue
        if fences and options and re.match(r"^:[\w-]+:", stripped):
            continue
        options = False
        stripped = re.sub(r"^(>\s*)+", "", stripped)
        # blank, heading, table, rule, MyST target "(label)=" or comment "% ..."
        skip = r"^(#{1,6}\s|\||-{3,}$|\*{3,}$|\([\w-]+\)=$|%)"
        if not stripped or re.match(skip, stripped):
            end()
            continue
        item = re.match(r"^([-*+]|\d+[.)])\s+(.*)", stripped)
        if item:
            end()
            stripped = item.group(2)
        current.append(stripped)
    end()
    return units


def split_sentences(unit: str) -> list[str]:
    """The sentences of one unit of prose, with their markup reduced to words."""
    text = _inline(unit)
    parts = re.split(r"(?<=[.!?])[\"'”’)\]]*\s+(?=\S)", text)
    return [p.replace(_DOT, ".").strip() for p in parts if words(p)]


def words(sentence: str) -> int:
    return sum(1 for token in sentence.split() if re.search(r"[A-Za-z0-9]", token))


def chapter_sentences(nb: dict) -> list[str]:
    """Every sentence of the chapter's markdown cells, in order."""
    return [
        sentence
        for cell in nb["cells"]
        if cell["cell_type"] == "markdown"
        for unit in prose_units(source(cell))
        for sentence in split_sentences(unit)
    ]


@dataclass(frozen=True)
class SentenceStats:
    sentences: int
    mean: float
    over: list[str]  # sentences over MAX_WORDS, longest first
    longest: list[str]  # every sentence, longest first

    def line(self, name: str) -> str:
        top = words(self.longest[0]) if self.longest else 0
        return (
            f"{name}: {self.sentences} sentences, mean {self.mean:.1f} words "
            f"(limit {MEAN_WORDS}), {len(self.over)} over {MAX_WORDS} words, "
            f"longest {top}"
        )


def sentence_stats(nb: dict) -> SentenceStats:
    sentences = chapter_sentences(nb)
    longest = sorted(sentences, key=words, reverse=True)
    mean = sum(map(words, sentences)) / len(sentences) if sentences else 0.0
    over = [s for s in longest if words(s) > MAX_WORDS]
    return SentenceStats(len(sentences), mean, over, longest)


def rule_sentences(nb: dict, name: str = "chapter") -> list[str]:
    stats = sentence_stats(nb)
    if stats.mean <= MEAN_WORDS and not stats.over:
        return []
    shown = "; ".join(f"{words(s)} words: {s[:100]}..." for s in stats.over[:3])
    return [stats.line(name) + (f"; e.g. {shown}" if shown else "")]


# ------------------------------------------------------------------------- the chapters


def converted(path: Path) -> dict:
    """The chapter's notebook (every chapter is held to the conventions)."""
    return load(path)


def _ids(path: Path) -> str:
    return path.stem


def _fail(path: Path, problems: list[str]) -> None:
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids)
def test_opens_with_its_title_and_in_this_chapter(path):
    _fail(path, rule_in_this_chapter(converted(path), number(path)))


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids)
def test_a_summary_comes_right_before_the_exercises(path):
    _fail(path, rule_summary_before_exercises(converted(path)))


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids)
def test_at_least_three_exercises_the_reader_writes_with_checkers(path):
    _fail(path, rule_exercises(converted(path)))


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids)
def test_enough_diagrams_drawn_by_the_package(path):
    _fail(path, rule_diagrams(converted(path), number(path)))


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids)
def test_every_figure_has_alt_text(path):
    _fail(path, rule_alt_text(converted(path)))


@pytest.mark.parametrize("path", CHAPTERS, ids=_ids)
def test_short_sentences(path):
    _fail(path, rule_sentences(converted(path), path.stem))


# ------------------------------------------------------------------- the rules can fail


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text: str, cell_tags=(), alt=None, image=False) -> dict:
    meta = {"tags": list(cell_tags)} if cell_tags else {}
    if alt is not None:
        meta["mystnb"] = {"image": {"alt": alt}}
    outputs = (
        [{"output_type": "display_data", "data": {"image/png": "iVBOR"}}]
        if image
        else []
    )
    return {"cell_type": "code", "metadata": meta, "source": text, "outputs": outputs}


SOLUTION = 'def my_softmax(x, dim=-1):\n    """Softmax."""\n    return x.softmax(dim)\n'
ALT = "Three matrices X, Q and K with arrows between them."


def conforming_chapter() -> dict:
    """A chapter 2 that follows every convention."""
    exercises = []
    for k in (1, 2, 3):
        exercises += [
            _md(f"### Exercise {k}: softmax\n\nWrite `my_softmax(x, dim)`."),
            _code(SOLUTION, ["solution", "hide-cell"]),
            _code("ch02.check_softmax(my_softmax)"),
        ]
    return {
        "cells": [
            _md(
                "# 2. Softmax\n\nScores become weights. "
                "This chapter builds the softmax.\n\n"
                ":::{admonition} In this chapter\n:class: tip\n- the formula\n"
                "- the max shift\n- the gradient\n:::\n"
            ),
            _code("from attention.exercises import ch02"),
            _code(
                "diagrams.qkv_projection()\nplt.show()",
                ["diagram", "remove-input"],
                ALT,
                image=True,
            ),
            _code(
                "diagrams.scores_to_output()\nplt.show()",
                ["diagram", "remove-input"],
                ALT,
                image=True,
            ),
            _md("## Summary\n\n- You can write a softmax.\n"),
            _md("## Exercises"),
            *exercises,
        ]
    }


def all_problems(nb: dict, chapter: int = 2) -> list[str]:
    return (
        rule_in_this_chapter(nb, chapter)
        + rule_summary_before_exercises(nb)
        + rule_exercises(nb)
        + rule_diagrams(nb, chapter)
        + rule_alt_text(nb)
        + rule_sentences(nb)
    )


def test_a_conforming_chapter_passes_every_rule():
    assert all_problems(conforming_chapter()) == []


def _broken(change) -> list[str]:
    nb = conforming_chapter()
    change(nb["cells"])
    return all_problems(nb)


@pytest.mark.parametrize(
    "change, fragment",
    [
        (lambda c: c[0].update(source="# Softmax\n"), "must start with '# 2. Title'"),
        (
            lambda c: c[0].update(source="# 2. Softmax\n\nNo box."),
            "no ':::{admonition}",
        ),
        (
            lambda c: c[0].update(
                source=c[0]["source"].replace("- the gradient\n", "")
            ),
            "has 2 bullets, not 3 to 5",
        ),
        (
            lambda c: c[0].update(source=c[0]["source"].replace(":class: tip\n", "")),
            "lacks ':class: tip'",
        ),
        (
            lambda c: c[4].update(source="## What we learned\n\n- a"),
            "is '## What we learned'",
        ),
        (lambda c: c[4].update(source="## Summary\n\nNo bullets."), "holds no bullets"),
        (lambda c: c.pop(-1), "2 exercises the reader writes"),
        (lambda c: c[-2]["metadata"].update(tags=["solution"]), "not tagged hide-cell"),
        (
            lambda c: c[-2].update(source="print(1)\n"),
            "holds only imports and definitions",
        ),
        (lambda c: c[-3].update(source="Write it."), "'### Exercise K: ...' heading"),
        (
            lambda c: c[-1].update(source="my_softmax(1)"),
            "not followed by a cell calling",
        ),
        (
            lambda c: c[-1].update(source="ch02.check_nothing(my_softmax)"),
            "calls ch02.check_nothing, not in attention.exercises",
        ),
        (lambda c: c.pop(3), "1 diagram cells (tagged diagram); chapter 2 needs 2"),
        (
            lambda c: c[2]["metadata"].update(tags=["diagram"]),
            "not tagged remove-input",
        ),
        (
            lambda c: c[2].update(source="plt.plot([1])\nplt.show()"),
            "does not draw with",
        ),
        (lambda c: c[2]["metadata"].pop("mystnb"), "has no alt text"),
        (
            lambda c: c[2]["metadata"]["mystnb"]["image"].update(alt="figure.png"),
            "not a sentence",
        ),
        (
            lambda c: c.insert(5, _code("plt.plot()", image=True)),
            "code cell 5 shows a figure",
        ),
        (lambda c: c.insert(5, _md(" ".join(["word"] * 46) + ".")), "1 over 45 words"),
        (
            # 12 sentences of 40 words beside the 9 sentences (26 words) of the rest
            lambda c: c.insert(5, _md(" ".join(["forty " * 39 + "words."] * 12))),
            "mean 24.1 words (limit 22)",
        ),
    ],
)
def test_each_rule_fails_a_chapter_that_breaks_it(change, fragment):
    problems = _broken(change)
    assert any(fragment in p for p in problems), problems


def test_diagram_counts_depend_on_the_chapter():
    nb = conforming_chapter()
    del nb["cells"][3]
    assert rule_diagrams(nb, 10) == []
    assert rule_diagrams(nb, 9) == [
        "1 diagram cells (tagged diagram); chapter 9 needs 2"
    ]


# ------------------------------------------------------------------------- the splitter


@pytest.mark.parametrize(
    "markdown, expected",
    [
        ("One. Two words here! Three?", ["One.", "Two words here!", "Three?"]),
        (
            "Use e.g. a mask, i.e. a bool tensor. Then stop.",
            ["Use e.g. a mask, i.e. a bool tensor.", "Then stop."],
        ),
        (
            "Vaswani et al. wrote it {cite}`vaswani2017`. Next.",
            ["Vaswani et al. wrote it Author.", "Next."],
        ),
        (
            "The {term}`softmax <Softmax>` of `x.sum(-1). y` is $e^x / Z. $ Done.",
            ["The softmax of code is math Done."],
        ),
        (
            "See [the docs](https://x.org/a.b). Then 0.5 and 2.13 stay.",
            ["See the docs.", "Then 0.5 and 2.13 stay."],
        ),
        ("# A heading\n\nText after it.", ["Text after it."]),
        ("(rope)=\n## RoPE\n% a comment\nText.", ["Text."]),
        (
            "Intro:\n- first item\n- second item. Two\n1. numbered",
            ["Intro:", "first item", "second item.", "Two", "numbered"],
        ),
        (
            "A line\ncontinues here.\n\nNew paragraph.",
            ["A line continues here.", "New paragraph."],
        ),
        ("Before\n```python\nx = 1. y = 2.\n```\nAfter.", ["Before", "After."]),
        ("$$\na = b. c\n$$\nText.", ["math Text."]),
        ("Then\n\n$$\na = b\n$$\n\nso it holds.", ["Then math so it holds."]),
        ("It is\n\n$$\na = b\n$$\n\nNext one.", ["It is math.", "Next one."]),
        ("It is $$a = b.$$ Next one.", ["It is math.", "Next one."]),
        ("**1. Unequal variances.** Check it.", ["Unequal variances.", "Check it."]),
        (
            ":::{dropdown} Going deeper: the trace\n:open:\nProse inside. More.\n:::\n",
            ["Prose inside.", "More."],
        ),
        (
            ":::{admonition} In this chapter\n:class: tip\n- learn a\n- do b\n:::",
            ["learn a", "do b"],
        ),
        ("```{math}\nx. y\n```\nOk.", ["Ok."]),
        ("| a. b | c |\n|---|---|\nText.", ["Text."]),
        ("> Quoted words. Again.", ["Quoted words.", "Again."]),
        (
            "Wait... then go (see Fig. 2). Yes etc. and no.",
            ["Wait... then go (see Fig. 2).", "Yes etc. and no."],
        ),
        ("It is **bold** and *it* ends.", ["It is bold and it ends."]),
    ],
)
def test_the_sentence_splitter(markdown, expected):
    found = [s for unit in prose_units(markdown) for s in split_sentences(unit)]
    assert found == expected


def test_words_count_tokens_with_letters_or_digits():
    assert words("The softmax — of code, is 2 math.") == 7


# --------------------------------------------------------------------------- the report


def report(paths: list[Path], top: int) -> str:
    lines = []
    for path in paths:
        stats = sentence_stats(load(path))
        lines.append(stats.line(path.stem))
        shown = stats.over or stats.longest[:top]
        for sentence in shown[: max(top, len(stats.over))]:
            wrapped = textwrap.fill(
                sentence, width=84, initial_indent="    ", subsequent_indent="    "
            )
            lines.append(f"  {words(sentence)} words:\n{wrapped}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Sentence statistics of the chapters.")
    parser.add_argument("--report", action="store_true", help="print the statistics")
    parser.add_argument("--top", type=int, default=3, help="longest sentences shown")
    parser.add_argument("chapters", nargs="*", type=Path, help="default: every chapter")
    args = parser.parse_args(argv)
    if not args.report:
        parser.error("run it with --report (pytest runs the tests)")
    print(report([p.resolve() for p in args.chapters] or CHAPTERS, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
