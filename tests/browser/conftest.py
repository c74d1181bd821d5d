"""Serve the built book on localhost and drive Debian's Chromium through Playwright.

Every request that does not go to the local server is aborted and recorded, so a page
that needs the network to render (a CDN script, a remote font) fails its test.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html"))
# `make test` (and so CI) sets COURSE_REQUIRE_BROWSER=1: there a missing book or browser
# fails. A reader's plain `pytest --nbval` skips these checks with a one-line reason.
REQUIRED = os.environ.get("COURSE_REQUIRE_BROWSER") == "1"


def _missing() -> str | None:
    """Why the browser checks cannot run here, or None when they can."""
    if not (HTML / "book" / "index.html").exists():
        return f"no built book at {HTML}: run `make book` first"
    if shutil.which("chromium") is None and shutil.which("chromium-browser") is None:
        return (
            "Chromium not found: scripts/ensure_chromium.sh installs Debian's package"
        )
    return None


def pytest_collection_modifyitems(config, items):
    reason = _missing()
    if reason is None or REQUIRED:
        return
    skip = pytest.mark.skip(reason=f"browser checks skipped: {reason}")
    for item in items:
        if "tests/browser" in item.nodeid:
            item.add_marker(skip)


def html_pages() -> list[Path]:
    """Every page of the book (the theme's generated search/index pages excluded)."""
    skip = {"search.html", "genindex.html"}
    return sorted(
        p
        for p in HTML.rglob("*.html")
        if "_static" not in p.parts
        and "_sources" not in p.parts
        and p.name not in skip
        and p.relative_to(HTML).as_posix() != "index.html"
    )  # a redirect stub


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output readable
        pass


@pytest.fixture(scope="session")
def server():
    if not (HTML / "book" / "index.html").exists():
        pytest.fail(f"no built book at {HTML}: run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail(
            "Chromium not found: scripts/ensure_chromium.sh installs Debian's package"
        )
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=exe,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield b
        b.close()


@pytest.fixture
def offline_page(browser, server):
    """A fresh page whose requests outside the local server are aborted and listed."""
    context = browser.new_context()
    external: list[str] = []

    def route(r):
        if r.request.url.startswith(server):
            r.continue_()
        else:
            external.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.errors = []  # uncaught script errors and console errors
    page.external = external
    page.on("pageerror", lambda e: page.errors.append(f"pageerror: {e}"))
    page.on(
        "console",
        lambda m: (
            page.errors.append(f"console: {m.text}") if m.type == "error" else None
        ),
    )
    yield page
    context.close()
