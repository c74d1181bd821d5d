"""Every built page renders offline: math typeset, images loaded, no script errors, no
dead links."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag

import pytest

from .conftest import HTML, html_pages

PAGES = html_pages()


def test_the_book_has_its_pages():
    names = {p.relative_to(HTML).as_posix() for p in PAGES}
    assert {"book/index.html", "book/preface.html", "book/how_to_run.html"} <= names
    assert any(n.startswith("chapters/") for n in names)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(HTML).as_posix())
def test_page_renders_offline(offline_page, server, path):
    page = offline_page
    url = f"{server}/{path.relative_to(HTML).as_posix()}"
    response = page.goto(url, wait_until="load")
    assert response is not None and response.ok
    # Wait for MathJax's start-up typesetting to finish when the page loads it.
    page.wait_for_function(
        "() => !window.MathJax"
        " || (window.MathJax.startup && window.MathJax.startup.promise)",
        timeout=20_000,
    )
    page.evaluate(
        "() => window.MathJax ? window.MathJax.startup.promise.then(() => true) : true"
    )
    n_math_sources = page.locator(".math, span.math, div.math").count()
    if n_math_sources:
        typeset = page.locator("mjx-container").count()
        assert typeset >= n_math_sources, (
            f"{typeset} typeset formulas for {n_math_sources} math blocks"
        )
        assert page.locator("mjx-merror").count() == 0, "MathJax reported a TeX error"
        assert page.locator("text=\\frac").count() == 0
    broken = page.evaluate(
        "() => Array.from(document.images)"
        ".filter(i => !(i.complete && i.naturalWidth > 0))"
        ".map(i => i.getAttribute('src'))"
    )
    assert broken == [], f"images that did not load: {broken}"
    assert page.errors == [], f"script errors: {page.errors}"
    assert page.external == [], f"requests that needed the network: {page.external}"


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])
        if tag in ("img", "script") and a.get("src"):
            self.hrefs.append(a["src"])
        if tag == "link" and a.get("href"):
            self.hrefs.append(a["href"])


def _parse(path: Path) -> _Links:
    p = _Links()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def test_internal_links_and_anchors_resolve():
    parsed = {
        path: _parse(path)
        for path in HTML.rglob("*.html")
        if "_static" not in path.parts
    }
    dead = []
    for path, links in parsed.items():
        for href in links.hrefs:
            if re.match(r"^[a-z]+:", href) or href.startswith("//"):
                continue  # external (http, mailto, javascript): not followed offline
            target, anchor = urldefrag(href)
            target = unquote(target.split("?")[0])
            dest = (path.parent / target).resolve() if target else path
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.exists():
                dead.append(f"{path.relative_to(HTML)} -> {href}")
            elif anchor and dest.suffix == ".html":
                ids = parsed[dest].ids if dest in parsed else _parse(dest).ids
                if unquote(anchor) not in ids:
                    dead.append(f"{path.relative_to(HTML)} -> {href} (no such anchor)")
    assert dead == [], "dead internal links:\n" + "\n".join(dead[:30])
