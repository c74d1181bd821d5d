"""The interview page: enough questions, each with a stable anchor and a link into the
chapter section that checks its answer, and every such link resolvable.

Section links use MyST's heading anchors (`myst_heading_anchors` in `_config.yml`).
The slugs are computed here with myst-parser's own rule, so a renamed heading fails
this test before it fails the book build.
"""

import functools
import json
import re
from pathlib import Path

import pytest
import yaml
from markdown_it.renderer import RendererHTML
from myst_parser.config.main import MdParserConfig
from myst_parser.mdit_to_docutils.base import default_slugify
from myst_parser.parsers.mdit import create_md_parser

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "interview.md"
QUESTION = re.compile(r"^### (\d+)\. (.+)$")
LABEL = re.compile(r"^\(([A-Za-z0-9_-]+)\)=$")
CHAPTER_LINK = re.compile(r"\]\(\.\./chapters/(\d\d_[a-z_]+)\.ipynb(?:#([^)\s]+))?\)")
CHAPTER_REF = re.compile(r"\{ref\}`[^`<]*<([a-z0-9-]+)>`")
MIN_QUESTIONS = 40


def _config():
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def _parser():
    config = _config()
    extensions = set(config["parse"]["myst_enable_extensions"])
    return create_md_parser(MdParserConfig(enable_extensions=extensions), RendererHTML)


def _questions():
    """(number, label, title, answer text) for every question on the page."""
    lines = PAGE.read_text().splitlines()
    found = []
    for i, line in enumerate(lines):
        match = QUESTION.match(line)
        if not match:
            continue
        label = LABEL.match(lines[i - 1]) if i > 0 else None
        body, in_code = [], False
        for rest in lines[i + 1 :]:
            if rest.startswith("```"):
                in_code = not in_code
            elif not in_code and (rest.startswith("#") or LABEL.match(rest)):
                break
            body.append(rest)
        found.append(
            (int(match[1]), label[1] if label else None, match[2], "\n".join(body))
        )
    return found


@functools.cache  # one parse per chapter: answers link the same ones often
def _chapter_targets(stem):
    """Heading slugs (as MyST computes them, down to the configured level) and
    explicit labels of one chapter."""
    level = _config()["sphinx"]["config"]["myst_heading_anchors"]
    notebook = json.loads((ROOT / "chapters" / f"{stem}.ipynb").read_text())
    md = _parser()
    slugs, labels = [], set()
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])
        labels.update(m[1] for m in re.finditer(r"^\(([^)\s]+)\)=\s*$", source, re.M))
        tokens = md.parse(source)
        for heading, inline in zip(tokens, tokens[1:]):
            if heading.type != "heading_open" or int(heading.tag[1]) > level:
                continue
            title = "".join(
                child.content
                for child in inline.children or []
                if child.type in ("text", "code_inline")
            )
            slug = base = default_slugify(title)
            n = 1
            while slug in slugs:
                slug, n = f"{base}-{n}", n + 1
            slugs.append(slug)
    return frozenset(slugs), frozenset(labels)


def test_at_least_forty_questions_numbered_in_order():
    numbers = [number for number, *_ in _questions()]
    assert len(numbers) >= MIN_QUESTIONS, f"{len(numbers)} questions"
    assert numbers == list(range(1, len(numbers) + 1)), numbers


def test_every_question_has_its_own_stable_label():
    labels = [label for _, label, *_ in _questions()]
    missing = [n for (n, label, *_) in _questions() if label is None]
    assert not missing, f"questions without a `(label)=` line above them: {missing}"
    assert all(label.startswith("interview-") for label in labels), labels
    assert len(set(labels)) == len(labels), "duplicate labels"


def test_every_answer_links_into_a_chapter():
    for number, _, title, answer in _questions():
        links = CHAPTER_LINK.findall(answer) + CHAPTER_REF.findall(answer)
        assert links, f"question {number} ({title}) links to no chapter"


def test_every_section_link_resolves():
    page = PAGE.read_text()
    chapter_labels = set()
    for stem in sorted({m[0] for m in CHAPTER_LINK.findall(page)}):
        assert (ROOT / "chapters" / f"{stem}.ipynb").exists(), stem
    broken = []
    for stem, fragment in CHAPTER_LINK.findall(page):
        slugs, labels = _chapter_targets(stem)
        chapter_labels |= labels
        if fragment and fragment not in slugs | labels:
            broken.append(f"{stem}#{fragment}")
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        chapter_labels |= _chapter_targets(path.stem)[1]
    broken += [
        f"{{ref}} {label}"
        for label in CHAPTER_REF.findall(page)
        if label not in chapter_labels
    ]
    assert not broken, f"links to no heading or label: {broken}"


def test_most_answers_link_a_section_not_only_a_chapter_top():
    tops = [
        number
        for number, _, _, answer in _questions()
        if not CHAPTER_REF.findall(answer)
        and not any(fragment for _, fragment in CHAPTER_LINK.findall(answer))
    ]
    # only chapters whose sections are still moving may be linked by their top
    assert len(tops) <= 3, f"answers linking only a chapter top: {tops}"


@pytest.mark.parametrize("width", [88])
def test_code_blocks_fit_the_column(width):
    inside, long = False, []
    for number, line in enumerate(PAGE.read_text().splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif inside and len(line) > width:
            long.append(number)
    assert not long, f"code lines over {width} columns: {long}"
