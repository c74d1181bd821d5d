"""Draw how the chapters depend on each other, from the table of contents.

    .venv/bin/python scripts/chapter_map.py # write book/_static/chapter_map.svg
    .venv/bin/python scripts/chapter_map.py --check # exit 1 if the committed map is
    stale

The chapters, their numbers and their parts come from `_toc.yml` (one column per part,
in reading order). What each chapter builds on is declared below, by the chapter's name
without its number, so renumbering needs no edit here: run the script and commit the
picture. The SVG is written by hand (no plotting library), so the same table of contents
always gives the same bytes; tests/test_chapter_map.py checks that the committed picture
is current and shows every chapter.
"""

from __future__ import annotations

import sys
from html import escape
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "_static" / "chapter_map.svg"

#: The name a box shows, by the chapter's file name without its number.
SHORT = {
    "dot_product": "Dot product",
    "softmax": "Softmax",
    "scaling": "Scaling",
    "masking": "Masking",
    "self_attention": "Self-attention",
    "multi_head": "Multi-head attention",
    "position": "Position",
    "cross_attention": "Cross-attention",
    "scoring_alignment": "Scoring, alignment",
    "linear_attention": "Linear attention",
    "associative_memory": "Associative memory",
    "gated_memory": "Gated memory",
    "sparse_attention": "Sparse attention",
    "memory_efficient": "Exact, in tiles",
    "distributed": "Across devices",
    "triton_flash": "Flash in Triton",
    "pretrained_model": "A pretrained model",
    "llm_inference": "LLM inference",
    "reading_attention": "Reading attention",
    "beyond_softmax": "Beyond softmax",
}

#: What each chapter builds on directly (its arrows come from these chapters).
PREREQUISITES = {
    "softmax": ["dot_product"],
    "scaling": ["softmax"],
    "masking": ["softmax"],
    "self_attention": ["scaling", "masking"],
    "multi_head": ["self_attention"],
    "position": ["multi_head"],
    "cross_attention": ["multi_head"],
    "scoring_alignment": ["cross_attention"],
    "linear_attention": ["self_attention"],
    "associative_memory": ["linear_attention"],
    "gated_memory": ["associative_memory"],
    "sparse_attention": ["self_attention"],
    "memory_efficient": ["self_attention"],
    "distributed": ["memory_efficient"],
    "triton_flash": ["memory_efficient"],
    "pretrained_model": ["multi_head", "position"],
    "llm_inference": ["multi_head", "position"],
    "reading_attention": ["multi_head"],
    "beyond_softmax": ["self_attention"],
}

WIDTH = 750
TOP = 40  # room for the part names
BOX_W, BOX_H, ROW = 134, 38, 48
PART_COLOURS = ["#dbe9f6", "#dff0df", "#fbe7d3", "#eadff2", "#f6dde4", "#e8e8e8"]


def chapter_parts(toc_path: Path = ROOT / "_toc.yml") -> list[tuple[str, list[str]]]:
    """(part caption, [chapter file stem, ...]) for every part that holds chapters."""
    toc = yaml.safe_load(toc_path.read_text())
    parts = []
    for part in toc.get("parts", []):
        stems = [
            Path(entry["file"]).name
            for entry in part.get("chapters", [])
            if str(entry.get("file", "")).startswith("chapters/")
        ]
        if stems:
            parts.append((part.get("caption", ""), stems))
    return parts


def name_of(stem: str) -> str:
    """'07_position' -> 'position'."""
    return stem.split("_", 1)[1]


def render(parts: list[tuple[str, list[str]]]) -> str:
    """The map as SVG text: one column per part, one box per chapter, arrows for
    what each chapter builds on."""
    unknown = [s for _, stems in parts for s in stems if name_of(s) not in SHORT]
    if unknown:
        raise SystemExit(
            f"scripts/chapter_map.py: add a short name for {unknown} to SHORT"
        )
    col_w = WIDTH / len(parts)
    boxes, number = {}, 0
    for c, (_, stems) in enumerate(parts):
        for r, stem in enumerate(stems):
            number += 1
            x = c * col_w + (col_w - BOX_W) / 2
            y = TOP + r * ROW
            boxes[name_of(stem)] = (number, stem, c, r, x, y)
    rows = max(len(stems) for _, stems in parts)
    height = TOP + rows * ROW + 4
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" aria-labelledby="map-title">',
        '<title id="map-title">How the chapters build on each other</title>',
        "<style>",
        "text { font-family: system-ui, -apple-system, 'Segoe UI', Roboto,"
        " 'DejaVu Sans', sans-serif; fill: #222; }",
        ".part { font-size: 11.5px; font-weight: 600; }",
        ".num { font-size: 10px; fill: #555; }",
        ".name { font-size: 11.5px; }",
        ".box { stroke: #666; stroke-width: 1; }",
        ".edge { fill: none; stroke: #8a8a8a; stroke-width: 1.2; }",
        "</style>",
        # dark text on light boxes in both colour modes: in dark mode the theme shows
        # images on a light panel, like the chapters' figures
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L8,4 L0,8 z" '
        'fill="#8a8a8a"/></marker></defs>',
    ]
    for c, (caption, _) in enumerate(parts):
        cx = c * col_w + col_w / 2
        for k, line in enumerate(_wrap(caption, 19)):
            out.append(
                f'<text class="part" x="{cx:.1f}" y="{13 + 13 * k}" '
                f'text-anchor="middle">{escape(line)}</text>'
            )
    after: dict[str, list[int]] = {}
    for target, sources in PREREQUISITES.items():
        for source in sources:
            if source not in boxes or target not in boxes:
                continue  # a chapter this table of contents does not have
            if _arrow(boxes[source], boxes[target]):
                out.append(_edge(boxes[source], boxes[target]))
            else:
                after.setdefault(target, []).append(boxes[source][0])
    for name, (n, stem, c, _, x, y) in boxes.items():
        colour = PART_COLOURS[c % len(PART_COLOURS)]
        note = (
            f" · after {', '.join(map(str, sorted(after[name])))}"
            if name in after
            else ""
        )
        out += [
            f'<g data-chapter="{stem}" data-number="{n}">',
            f'<rect class="box" x="{x:.1f}" y="{y}" width="{BOX_W}" '
            f'height="{BOX_H}" rx="6" fill="{colour}"/>',
            f'<text class="num" x="{x + 7:.1f}" y="{y + 14}">Chapter {n}{note}</text>',
            f'<text class="name" x="{x + 7:.1f}" y="{y + 30}">'
            f"{escape(SHORT[name])}</text>",
            "</g>",
        ]
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _arrow(source, target) -> bool:
    """Drawn as an arrow: the next box down, or a box in the next column. Any other
    prerequisite is named on the box instead ("after 6, 7"), so no arrow crosses a
    box."""
    _, _, sc, sr, *_ = source
    _, _, tc, tr, *_ = target
    return (sc == tc and tr == sr + 1) or tc == sc + 1


def _edge(source, target) -> str:
    _, _, sc, sr, sx, sy = source
    _, _, tc, tr, tx, ty = target
    if sc == tc:  # the next box down
        x = sx + BOX_W / 2
        path = f"M{x:.1f},{sy + BOX_H} L{x:.1f},{ty - 1}"
    else:  # to the next part: from the right side to the left side
        x0, y0 = sx + BOX_W, sy + BOX_H / 2
        x1, y1 = tx - 1, ty + BOX_H / 2
        bend = (x1 - x0) / 2
        path = (
            f"M{x0:.1f},{y0} C{x0 + bend:.1f},{y0} {x1 - bend:.1f},{y1} {x1:.1f},{y1}"
        )
    return f'<path class="edge" d="{path}" marker-end="url(#arrow)"/>'


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + [line] if line else lines


def main(argv: list[str]) -> int:
    svg = render(chapter_parts())
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != svg:
            print(f"{OUT.relative_to(ROOT)} is out of date: run scripts/chapter_map.py")
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(svg)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
