"""What a reader sees: navigation on a phone and a desktop, clean outputs, math,
figures.

Two kinds of check. Those that read the built HTML (streams per cell, line widths, raw
math, alt texts, chapter numbers, bibliography labels) parse the pages and need no
browser. Those about behaviour and layout (the sidebar buttons, the start button, wide
screens, long formulas on a phone, dark mode, the favicon, opening a figure) drive
headless Chromium at a phone's 400 px and a desktop's 1,400 px.

Every check holds for every page: none is expected to fail.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from pathlib import Path
from urllib.parse import urljoin

import pytest
import yaml

from .conftest import HTML, ROOT, html_pages

PAGES = html_pages()
CHAPTER_PAGES = [p for p in PAGES if p.parent.name == "chapters"]
BOOK_PAGES = [p for p in PAGES if p.parent.name != "chapters"]
PHONE = {"width": 400, "height": 800}
DESKTOP = {"width": 1400, "height": 900}
MAX_COLUMNS = 88


def page_id(path: Path) -> str:
    return path.relative_to(HTML).as_posix()


def topic(path: Path) -> str:
    """'07_position' -> 'position': the name that survives a renumbering."""
    return path.stem.split("_", 1)[-1]


@functools.cache
def soup(path: Path):
    """The parsed page (parsed once per session: every check here only reads it)."""
    from bs4 import BeautifulSoup

    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def toc_chapters() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [
        Path(c["file"]).name
        for part in toc["parts"]
        for c in part.get("chapters", [])
        if c["file"].startswith("chapters/")
    ]


def columns(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)


# --- Outputs: one stream block per cell -----------------------------------------------
# Cells that print a line beside their progress bar (stdout and stderr blocks); the
# chapters move the printed result to the next cell (CONVENTIONS, "Progress bars").
@pytest.mark.parametrize("path", CHAPTER_PAGES, ids=page_id)
def test_no_cell_shows_more_than_one_stream_block(path):
    crowded = []
    for n, out in enumerate(soup(path).select("div.cell_output")):
        blocks = out.select("div.output.stream, div.output.stderr")
        if len(blocks) > 1:
            crowded.append(f"output {n}: {len(blocks)} stream blocks")
    assert crowded == [], f"{page_id(path)}: " + "; ".join(crowded)


# --- Code and printed lines fit the column --------------------------------------------
def wide_lines(path: Path) -> list[str]:
    found = []
    for pre in soup(path).select("div.cell pre"):
        for line in pre.get_text().splitlines():
            if columns(line) > MAX_COLUMNS:
                found.append(
                    f"{page_id(path)}: {columns(line)} columns: {line[:50]}..."
                )
    return found


def test_every_code_and_output_line_fits_88_columns():
    found = [line for path in CHAPTER_PAGES for line in wide_lines(path)]
    assert CHAPTER_PAGES and found == [], f"{len(found)} lines too wide:\n" + "\n".join(
        found[:30]
    )


def test_an_88_column_line_fits_the_code_column_at_1400_px(browser, server):
    page = browser.new_page(viewport=DESKTOP)
    page.goto(
        f"{server}/chapters/{toc_chapters()[0]}.html", wait_until="domcontentloaded"
    )
    overflow = page.evaluate(
        """() => {
          // a copy of the page's first code cell, holding one line of 88 characters
          const cell = document.querySelector('div.cell').cloneNode(true);
          document.querySelector('.bd-article section').appendChild(cell);
          const pre = cell.querySelector('div.cell_input pre');
          pre.textContent = 'x'.repeat(88);
          return [pre.scrollWidth, pre.clientWidth];
        }"""
    )
    page.close()
    assert overflow[0] <= overflow[1], f"an 88-column line scrolls: {overflow}"


def test_wide_screens_give_code_cells_the_empty_right_margin(browser, server):
    page = browser.new_page(viewport={"width": 1920, "height": 1000})
    page.goto(
        f"{server}/chapters/{toc_chapters()[0]}.html", wait_until="domcontentloaded"
    )
    box = page.evaluate(
        """() => {
          const r = s => document.querySelector(s).getBoundingClientRect();
          return {cell: r('div.cell'), prose: r('.bd-article section > p'),
                  toc: r('.bd-sidebar-secondary')};
        }"""
    )
    page.close()
    assert box["cell"]["width"] > box["prose"]["width"] + 100, box
    assert box["cell"]["right"] <= box["toc"]["left"], (
        "a code cell runs under the contents"
    )


# --- Package source shown as highlighted, numbered listings -------------------------
def listings(path: Path):
    """The ``{literalinclude}`` listings of a page: numbered blocks with a caption."""
    return [
        block
        for block in soup(path).select("div.literal-block-wrapper")
        if block.select("pre span.linenos")
    ]


def test_chapter_16_shows_its_kernels_as_numbered_emphasised_listings():
    """The kernels read line by line are highlighted source with the file's line
    numbers, the discussed lines emphasised, every line (number included) within 88
    columns; not printed text. tests/test_chapter_listings.py ties the emphasised
    lines to the prose."""
    (page,) = [p for p in CHAPTER_PAGES if topic(p) == "triton_flash"]
    shown = listings(page)
    assert len(shown) >= 3, f"{page_id(page)}: {len(shown)} numbered listings"
    for block in shown:
        pre = block.select_one("pre")
        caption = block.select_one(".caption-text").get_text()
        assert pre.select("span.hll"), f"{caption}: no emphasised line"
        assert pre.select("span.k, span.n"), f"{caption}: not highlighted"
        wide = [line for line in pre.get_text().splitlines() if columns(line) > 88]
        assert not wide, f"{caption}: {len(wide)} lines over 88 columns"
    printed = [
        out.get_text()
        for out in soup(page).select("div.cell_output")
        if "@triton.jit" in out.get_text()
    ]
    assert printed == [], "a kernel's source is printed as output"


# --- No raw math ----------------------------------------------------------------------
MATH_CLASSES = {"math", "tex2jax_process", "mathjax_process", "output_area"}
NOT_PROSE = {"script", "style", "pre", "code", "kbd", "samp", "textarea", "svg"}
RAW_MATH = re.compile(r"\$|\\\(|\\\[")


# 06: an inline formula broken across lines in "What the cache saves per step"
def raw_math(doc) -> list[str]:
    """Text a reader sees with a ``$``, ``\\(`` or ``\\[`` outside typeset math."""
    from bs4 import Comment

    found = []
    if doc.title and RAW_MATH.search(doc.title.get_text()):
        found.append(f"tab title: {doc.title.get_text()!r}")
    for text in doc.body.find_all(string=RAW_MATH):
        if isinstance(text, Comment):
            continue
        if any(
            p.name in NOT_PROSE or MATH_CLASSES & set(p.get("class") or [])
            for p in text.parents
        ):
            continue
        found.append(repr(text.strip()[:70]))
    for tag in doc.body.find_all(attrs={"title": RAW_MATH}):  # tooltips
        found.append(f"tooltip: {tag['title'][:70]!r}")
    return found


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_no_page_shows_raw_math(path):
    found = raw_math(soup(path))
    assert found == [], f"{page_id(path)}: raw math: {found}"


def test_the_raw_math_check_sees_raw_math():
    from bs4 import BeautifulSoup

    doc = BeautifulSoup(
        "<html><head><title>Scaling by \\(\\sqrt{d}\\)</title></head><body>"
        "<p>costs $O(n^2)$ here</p><p><span class='math'>\\(x\\)</span></p>"
        "<pre>price = '$5'</pre><a title='a $b$ tip'>x</a></body></html>",
        "html.parser",
    )
    found = raw_math(doc)
    assert len(found) == 3 and "tab title" in found[0] and "tooltip" in found[2], found


# --- Alt text on every figure ---------------------------------------------------------
# a file name or path standing in for a description: one word with a slash or an image
# extension ("../_images/9db0....png"); "tokens/s against length" is a description
PATH_LIKE = re.compile(r"^\S*(/|\\|\.(png|jpe?g|svg|gif|webp)\b)\S*$", re.I)


def bad_alt_texts(path: Path) -> list[str]:
    bad = []
    for img in soup(path).find_all("img"):
        alt = (img.get("alt") or "").strip()
        if not alt or PATH_LIKE.search(alt):
            bad.append(f"{page_id(path)}: {img.get('src')} has alt {alt!r}")
    return bad


def test_the_alt_text_check_knows_a_path_from_a_description():
    assert PATH_LIKE.search("../_images/9db09db15f.png")
    assert PATH_LIKE.search("figure.svg")
    assert not PATH_LIKE.search("Throughput in tokens/s against the sequence length.")
    assert not PATH_LIKE.search("A heatmap of the weights.")


def test_the_pages_outside_the_chapters_give_every_image_alt_text():
    bad = [b for path in BOOK_PAGES for b in bad_alt_texts(path)]
    assert BOOK_PAGES and bad == [], "\n".join(bad)


def test_every_chapter_figure_has_alt_text_that_says_what_it_shows():
    bad = [b for path in CHAPTER_PAGES for b in bad_alt_texts(path)]
    assert CHAPTER_PAGES and bad == [], f"{len(bad)} images:\n" + "\n".join(bad[:30])


# --- Chapter numbers ------------------------------------------------------------------
def test_chapter_titles_tabs_and_sidebar_show_the_chapter_number():
    wrong = []
    for n, stem in enumerate(toc_chapters(), 1):
        path = HTML / "chapters" / f"{stem}.html"
        doc = soup(path)
        h1 = doc.select_one("article h1").get_text().strip()
        tab = doc.title.get_text().strip()
        link = doc.select_one(
            f'nav.bd-docs-nav a[href$="{stem}.html"], nav.bd-docs-nav a.current'
        )
        for what, text in (
            ("title", h1),
            ("tab", tab),
            ("sidebar", link.get_text().strip()),
        ):
            if not text.startswith(f"{n}. "):
                wrong.append(
                    f"{stem}: {what} {text[:40]!r} does not start with '{n}. '"
                )
    assert wrong == [], "\n".join(wrong)


# --- Bibliography ---------------------------------------------------------------------
def test_bibliography_labels_read_like_the_citations_in_the_text():
    entries = {}
    for div in soup(HTML / "book" / "bibliography.html").select("div.citation"):
        label = div.select_one("span.label").get_text().strip("[] \n")
        entries[div["id"]] = label
        assert re.fullmatch(r".+, (\d{4}|n\.d\.)[a-z]?", label), label
        assert "[" not in label and "+" not in label, label
    mismatched = []
    for path in PAGES:
        for a in soup(path).select('a[href*="bibliography.html#"]'):
            target = a["href"].split("#", 1)[1]
            text = " ".join(a.get_text().split())
            if target in entries and not " ".join(entries[target].split()).startswith(
                text
            ):
                mismatched.append(
                    f"{page_id(path)}: cited {text!r}, listed {entries[target]!r}"
                )
    assert entries and mismatched == [], "\n".join(mismatched[:20])


# --- Navigation: the ☰ and contents buttons ------------------------------------------
def _phone(browser):
    context = browser.new_context(viewport=PHONE, has_touch=True, is_mobile=True)
    return context, context.new_page()


def test_on_a_phone_each_sidebar_button_opens_its_drawer(browser, server):
    context, page = _phone(browser)
    try:
        page.goto(
            f"{server}/chapters/{toc_chapters()[0]}.html", wait_until="domcontentloaded"
        )
        page.locator(".bd-header-article .primary-toggle").tap()
        drawer = page.locator("#pst-primary-sidebar-modal")
        drawer.wait_for(state="visible", timeout=5_000)
        assert drawer.evaluate("d => d.open")
        assert drawer.get_by_role("link").filter(has_text="Softmax").count() >= 1
        page.keyboard.press("Escape")
        drawer.wait_for(state="hidden", timeout=5_000)

        page.locator(".bd-header-article .secondary-toggle").tap()
        contents = page.locator("#pst-secondary-sidebar-modal")
        contents.wait_for(state="visible", timeout=5_000)
        assert contents.locator("nav a").count() >= 3  # the page's sections
    finally:
        context.close()


def test_on_a_desktop_the_menu_button_collapses_and_restores_the_sidebar(
    browser, server
):
    page = browser.new_page(viewport=DESKTOP)
    try:
        page.goto(
            f"{server}/chapters/{toc_chapters()[0]}.html", wait_until="domcontentloaded"
        )
        sidebar = page.locator("#pst-primary-sidebar")
        button = page.locator(".bd-header-article .primary-toggle")
        assert sidebar.is_visible()
        article = page.locator("article.bd-article").bounding_box()["width"]
        button.click()
        sidebar.wait_for(state="hidden", timeout=5_000)
        assert not page.locator("#pst-primary-sidebar-modal").evaluate("d => d.open")
        page.wait_for_timeout(400)  # the theme animates the column
        assert page.locator("article.bd-article").bounding_box()["width"] > article
        button.click()
        sidebar.wait_for(state="visible", timeout=5_000)
    finally:
        page.close()


# --- The landing page -----------------------------------------------------------------
@pytest.mark.parametrize("viewport", [PHONE, DESKTOP], ids=["400px", "1400px"])
def test_the_landing_page_starts_the_reader_at_chapter_1(browser, server, viewport):
    page = browser.new_page(viewport=viewport)
    try:
        page.goto(f"{server}/book/index.html", wait_until="domcontentloaded")
        start = page.get_by_role("link", name=re.compile(r"Start with chapter 1"))
        assert start.count() == 1 and start.is_visible()
        assert (
            start.bounding_box()["y"] + start.bounding_box()["height"]
            <= viewport["height"]
        ), "the start button is below the first screen"
        first = toc_chapters()[0]
        assert start.get_attribute("href").endswith(f"chapters/{first}.html")
        start.click()
        page.wait_for_url(re.compile(rf"chapters/{first}\.html"))
        assert page.locator("article h1").count() == 1
    finally:
        page.close()


def test_the_landing_page_opens_chapter_1_in_this_repository_on_colab():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = config["repository"]["url"].removeprefix("https://github.com/").rstrip("/")
    expected = (
        f"https://colab.research.google.com/github/{repo}/blob/"
        f"{config['repository']['branch']}/chapters/{toc_chapters()[0]}.ipynb"
    )
    hrefs = [
        a["href"] for a in soup(HTML / "book" / "index.html").find_all("a", href=True)
    ]
    assert expected in hrefs


# --- Small things ---------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_colour_mode_follows_the_system(browser, server, scheme):
    context = browser.new_context(color_scheme=scheme)
    try:
        page = context.new_page()
        page.goto(f"{server}/book/index.html", wait_until="domcontentloaded")
        assert page.evaluate("document.documentElement.dataset.theme") == scheme
    finally:
        context.close()


def test_every_request_of_a_page_finds_its_file_including_the_favicon(browser, server):
    page = browser.new_page()
    failed = []
    page.on(
        "response",
        lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None,
    )
    try:
        page.goto(f"{server}/book/index.html", wait_until="networkidle")
        icon = page.locator('link[rel="icon"]').get_attribute("href")
        response = page.request.get(urljoin(page.url, icon))
        assert response.ok and "svg" in response.headers["content-type"]
    finally:
        page.close()
    assert failed == []


def test_long_display_math_scrolls_on_a_phone_and_shows_it(browser, server):
    context, page = _phone(browser)
    try:
        page.goto(
            f"{server}/chapters/{toc_chapters()[0]}.html", wait_until="domcontentloaded"
        )
        page.wait_for_function(
            "() => window.MathJax && MathJax.typesetPromise", timeout=20_000
        )
        terms = " + ".join(f"a_{{{k}}} b_{{{k}}}" for k in range(40))
        state = page.evaluate(
            """async (terms) => {
              const div = document.createElement('div');
              div.className = 'math notranslate nohighlight';
              div.textContent = '\\\\[' + terms + '\\\\]';
              document.querySelector('.bd-article section').appendChild(div);
              await MathJax.typesetPromise([div]);
              const box = div.querySelector('mjx-container');
              const style = getComputedStyle(box);
              return {overflow: style.overflowX, scroll: box.scrollWidth,
                      width: box.clientWidth, cue: style.backgroundImage,
                      page: document.documentElement.scrollWidth};
            }""",
            terms,
        )
    finally:
        context.close()
    assert (
        state["overflow"] in ("auto", "scroll") and state["scroll"] > state["width"]
    ), state
    assert "gradient" in state["cue"], "nothing shows that the formula goes on"
    assert state["page"] <= PHONE["width"], "the page itself scrolls sideways"


def test_on_a_phone_a_figure_fits_and_opens_full_size(browser, server):
    with_figures = [
        p for p in CHAPTER_PAGES if soup(p).select_one("div.cell_output img")
    ]
    path = min(with_figures, key=lambda p: p.stat().st_size)  # the quickest to load
    context, page = _phone(browser)
    try:
        page.goto(f"{server}/{page_id(path)}")  # images loaded: their shape is known
        figures = page.evaluate(
            """() => Array.from(document.querySelectorAll('div.cell_output img'))
              .map(img => {
              const a = img.closest('a');
              const r = img.getBoundingClientRect();
              return {src: img.src, href: a ? a.href : null, width: r.width,
                      shape: (r.height / r.width)
                             / (img.naturalHeight / img.naturalWidth)};
            })"""
        )
        assert figures and all(f["href"] == f["src"] for f in figures), figures
        assert all(f["width"] <= PHONE["width"] for f in figures), figures
        assert all(abs(f["shape"] - 1) < 0.02 for f in figures), (
            "a figure lost its shape"
        )
        with page.expect_navigation() as opened:
            page.locator("div.cell_output a.image-reference").first.tap()
        response = opened.value
        assert response.ok and response.headers["content-type"] == "image/png"
    finally:
        context.close()
