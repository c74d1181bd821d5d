"""Small fixes to the HTML that Jupyter Book 1's theme stack emits.

1. sphinx-thebe registers its inline configuration script (``const THEBE_JS_URL = ...``)
   once per read of the environment; with ``--all`` the page gets it twice and the
   browser throws "Identifier 'THEBE_JS_URL' has already been declared" (one copy has
   filename None, the other '', so Sphinx's own de-duplication misses it). We drop
   duplicates from each page's script list.
2. pydata-sphinx-theme reads its colour mode from ``html_context["default_mode"]``;
   left unset, its start-up script logs "Got invalid theme mode". We set "light".
3. Sphinx adds MathJax only to pages where it detected equations, and it misses math
   inside some directives (the glossary's definitions). MathJax is vendored locally, so
   we load it on every page.
"""

from __future__ import annotations


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


def _default_mode(app, config):
    config.html_context = {**(config.html_context or {}), "default_mode": "light"}


def setup(app):
    app.set_html_assets_policy("always")
    app.connect("config-inited", _default_mode)
    # early: Sphinx stops calling handlers after the first one that returns a template
    app.connect("html-page-context", _dedupe_scripts, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
