"""Small fixes to the HTML that Jupyter Book 1's theme stack emits.

1. sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL = ...``)
   once per read of the environment; with ``--all`` the page gets it twice and the
   browser throws "Identifier 'THEBE_JS_URL' has already been declared" (one copy has
   filename None, the other '', so Sphinx's own de-duplication misses it). We drop
   duplicates from each page's script list.
2. pydata-sphinx-theme reads its colour mode from ``html_context["default_mode"]``;
   left unset, its start-up script logs "Got invalid theme mode". We set "auto": the
   page follows the reader's system setting until the reader picks a mode.
3. Sphinx adds MathJax only to pages where it detected equations, and it misses math
   inside some directives (the glossary's definitions). MathJax is vendored locally, so
   we load it on every page.
4. ``static/course.js`` makes the sidebar buttons work (the themes bind their handlers
   to a hidden copy of each button; see the script) and links every output figure to its
   PNG; ``static/course.css`` fits an 88-column code line in the column, lets code cells
   use the empty right margin of wide screens and shows that long display math scrolls;
   ``static/favicon.svg`` is the tab icon.
5. A page title with math ("Scaling by $\\sqrt{d_k}$") reaches the browser tab as raw
   TeX, ``\\(\\sqrt{d_k}\\)``: the tab cannot typeset it. We give the tab a plain-text
   title instead ("Scaling by √d_k").
6. The bibliography's labels read like the author-year citations in the text
   ("Vaswani et al., 2017" in both places): the pybtex style ``course_author_year``
   that ``_config.yml`` names as ``bibtex_default_style``.
"""

from __future__ import annotations

import re
from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for js in scripts:
        # the same inline script arrives once with filename None and once with ''
        attrs = getattr(js, "attributes", {}) or {}
        key = (getattr(js, "filename", None) or "", tuple(sorted(attrs.items())))
        if key not in seen:
            seen.add(key)
            unique.append(js)
    scripts[:] = unique  # in place: later handlers (MathJax) append to this same list


_TEX_SYMBOLS = {
    "sqrt": "√",
    "top": "⊤",
    "cdot": "·",
    "times": "×",
    "le": "≤",
    "ge": "≥",
    "leq": "≤",
    "geq": "≥",
    "approx": "≈",
    "infty": "∞",
    "to": "→",
    "in": "∈",
    "alpha": "α",
    "beta": "β",
    "gamma": "γ",
    "lambda": "λ",
    "sigma": "σ",
    "tau": "τ",
    "theta": "θ",
    "phi": "φ",
    "ell": "ℓ",
}
_INLINE_MATH = re.compile(r"\\\((.*?)\\\)|\$(.+?)\$")


def tex_as_text(tex: str) -> str:
    """Inline TeX as plain text, for places that cannot typeset it (a browser tab).

    >>> tex_as_text(r"\\sqrt{d_k}"), tex_as_text(r"O(N \\cdot d^2)")
    ('√d_k', 'O(N · d^2)')
    """
    text = re.sub(r"\\([A-Za-z]+)", lambda m: _TEX_SYMBOLS.get(m.group(1), ""), tex)
    return re.sub(r"[{}\\]", "", text)


def _plain_tab_title(app, pagename, templatename, context, doctree):
    title = context.get("title")
    if title and ("\\(" in title or "$" in title):
        plain = re.sub(r"<[^>]+>", "", title)  # the math arrives wrapped in a <span>
        context["title"] = _INLINE_MATH.sub(
            lambda m: tex_as_text(m.group(1) or m.group(2)), plain
        )


def _configure(app, config):
    config.html_context = {**(config.html_context or {}), "default_mode": "auto"}
    config.html_static_path = [*config.html_static_path, str(STATIC)]
    config.html_favicon = str(STATIC / "favicon.svg")


# --- Bibliography labels in the author-year form of the citations ---------------------
def _register_bibliography_style():
    import codecs

    import latexcodec  # noqa: F401  (registers the "ulatex" codec; pybtex depends on it)
    from pybtex.plugin import register_plugin
    from pybtex.style.formatting.unsrt import Style as UnsrtStyle
    from pybtex.style.labels import BaseLabelStyle
    from pybtex.style.sorting import BaseSortingStyle

    def last_names(person) -> str:
        """'Veli{\\v{c}}kovi{\\'c}' -> 'Veličković'.

        A codec, because pybtex's rich text is slow.
        """
        tex = " ".join(person.prelast_names + person.last_names)
        return codecs.decode(tex, "ulatex").replace("{", "").replace("}", "")

    class AuthorYearLabels(BaseLabelStyle):
        """'Vaswani et al., 2017', 'Bahdanau, Cho and Bengio' shortened as the citations
        are ('A', 'A and B', 'A et al.'), with a, b, ... after the year when two entries
        would get the same label."""

        def format_labels(self, sorted_entries):
            labels = [self._label(entry) for entry in sorted_entries]
            repeated = {label for label in labels if labels.count(label) > 1}
            seen: dict[str, int] = {}
            for label in labels:
                if label in repeated:
                    seen[label] = seen.get(label, 0) + 1
                    yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label] - 1]
                else:
                    yield label

        @staticmethod
        def _label(entry) -> str:
            return f"{authors(entry)}, {entry.fields.get('year', 'n.d.')}"

    def authors(entry) -> str:
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [last_names(p) for p in persons[:3]]
        if not names:
            return str(entry.fields.get("title", entry.key))
        if len(names) == 1:
            return names[0]
        # "A and others" is cited "A et al."
        if len(names) == 2 and names[1] != "others":
            return f"{names[0]} and {names[1]}"
        return f"{names[0]} et al."

    class AuthorYearOrder(BaseSortingStyle):
        """By the label's names, then year, then title."""

        def sorting_key(self, entry):
            title = str(entry.fields.get("title", ""))
            return (
                authors(entry).lower(),
                str(entry.fields.get("year", "")),
                title.lower(),
            )

    class CourseAuthorYear(UnsrtStyle):
        default_label_style = AuthorYearLabels
        default_sorting_style = AuthorYearOrder

    register_plugin("pybtex.style.formatting", "course_author_year", CourseAuthorYear)


def setup(app):
    app.set_html_assets_policy("always")
    _register_bibliography_style()
    app.connect("config-inited", _configure)
    # early: Sphinx stops calling handlers after the first one that returns a template
    app.connect("html-page-context", _dedupe_scripts, priority=100)
    app.connect("html-page-context", _plain_tab_title, priority=100)
    app.add_css_file("course.css")
    app.add_js_file("course.js", loading_method="defer")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
