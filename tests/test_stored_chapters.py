"""What the stored chapters put on the page: clean streams, 88 columns, readable text.

The first tests check scripts/execute_chapter.py, which stores a chapter with its
streams coalesced (a tqdm bar leaves its final frame only). The others read every stored
chapter: no cell holds two consecutive outputs of one stream or a carriage return, every
code line and printed line fits 88 columns (the width of the book's code column), and no
figure text is set below 8 pt by an explicit size in a chapter's code.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
MAX_COLUMNS = 88
MIN_POINTS = 8.0
COURSE_FONT_SIZE = 10.0  # font.size of attention.plotting.COURSE_STYLE


def _script():
    spec = importlib.util.spec_from_file_location(
        "execute_chapter", ROOT / "scripts" / "execute_chapter.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stream(name, text):
    return {"output_type": "stream", "name": name, "text": text}


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def load(path):
    return json.loads(path.read_text())


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value


# --- scripts/execute_chapter.py -------------------------------------------------------
def test_a_progress_bar_leaves_its_final_frame_only():
    ex = _script()
    frames = [
        stream("stderr", f"\r{p:3d}%|{'#' * (p // 10):<10}|") for p in range(0, 101, 10)
    ]
    out = ex.coalesce_streams(
        [stream("stdout", "start\n"), *frames, stream("stderr", "\n")]
    )
    assert [(o["name"], o["text"]) for o in out] == [
        ("stdout", "start\n"),
        ("stderr", "100%|##########|\n"),
    ]


def test_coalescing_keeps_the_order_and_the_other_outputs():
    ex = _script()
    figure = {"output_type": "display_data", "data": {"text/plain": "<Figure>"}}
    outputs = [
        stream("stdout", "a\n"),
        stream("stdout", "b\n"),
        figure,
        stream("stdout", "c\n"),
        stream("stderr", "w\n"),
        stream("stdout", "d\r\n"),
    ]
    out = ex.coalesce_streams(outputs)
    assert [o.get("name", o["output_type"]) for o in out] == [
        "stdout",
        "display_data",
        "stdout",
        "stderr",
        "stdout",
    ]
    assert [o.get("text") for o in out] == ["a\nb\n", None, "c\n", "w\n", "d\n"]


def test_clean_stream_text_applies_carriage_returns_and_backspaces_per_line():
    ex = _script()
    assert ex.clean_stream_text("one\rtwo\rthree\nnext\n") == "three\nnext\n"
    assert ex.clean_stream_text("50%\r") == "50%"
    assert ex.clean_stream_text("abc\x08\x08d\n") == "ad\n"
    assert ex.clean_stream_text("plain\ntext\n") == "plain\ntext\n"


@pytest.mark.slow  # starts a kernel
def test_execute_chapter_runs_a_fresh_kernel_in_the_notebooks_folder(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import sys\n"
            "for p in range(0, 101, 25):\n"
            "    sys.stderr.write(f'\\r{p}%')\n"
            "    sys.stderr.flush()\n"
            "sys.stderr.write('\\n')\n"
            "sys.stderr.flush()  # as tqdm does when it closes\n"
            "print('trained')"
        ),
        nbformat.v4.new_code_cell("import os\nprint(os.path.basename(os.getcwd()))"),
    ]
    # a timestamp an earlier run stored, which the script removes
    nb.cells[1].metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    folder = tmp_path / "chapter_folder"
    folder.mkdir()
    path = folder / "tiny.ipynb"
    nbformat.write(nb, path)
    assert _script().main([str(path), "--timeout", "120"]) == 0
    cells = nbformat.read(path, as_version=4).cells
    assert [c.execution_count for c in cells] == [1, 2]
    streams = {o["name"]: o["text"] for o in cells[0].outputs}
    assert streams == {"stderr": "100%\n", "stdout": "trained\n"}
    assert [o["text"] for o in cells[1].outputs] == ["chapter_folder\n"]
    assert not any("execution" in c.metadata for c in cells), "timing metadata stored"


def test_stored_chapters_hold_no_cell_timing_metadata():
    """Per-cell timestamps change at every run: a stored chapter would differ on every
    re-execution for no reason (scripts/execute_chapter.py does not record them)."""
    timed = [
        f"{path.name} cell {n}"
        for path in CHAPTERS
        for n, cell in enumerate(load(path)["cells"])
        if "execution" in cell.get("metadata", {})
    ]
    assert not timed, timed


# --- The stored chapters --------------------------------------------------------------
def test_stored_chapters_hold_one_output_per_stream_and_no_progress_frames():
    bad = []
    for path in CHAPTERS:
        for n, cell in enumerate(code_cells(load(path))):
            outputs = cell.get("outputs", [])
            for a, b in zip(outputs, outputs[1:]):
                if (
                    a["output_type"] == b["output_type"] == "stream"
                    and a["name"] == b["name"]
                ):
                    bad.append(
                        f"{path.name} code cell {n}: consecutive {a['name']} outputs"
                    )
                    break
            if any(
                o["output_type"] == "stream" and "\r" in _text(o["text"])
                for o in outputs
            ):
                bad.append(
                    f"{path.name} code cell {n}: a carriage return (progress frames)"
                )
    assert bad == [], "store chapters with scripts/execute_chapter.py:\n" + "\n".join(
        bad[:40]
    )


def columns(line: str) -> int:
    """Terminal columns of ``line``: wide (East Asian) characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)


def printed_texts(cell):
    """The stream and plain-text outputs a reader sees as printed lines."""
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            yield _text(out["text"])
        elif out["output_type"] in ("execute_result", "display_data"):
            data = out.get("data", {})
            # a figure or a table is shown instead of its text/plain
            if set(data) <= {"text/plain"}:
                yield _text(data.get("text/plain", ""))


def too_wide(path: Path) -> list[str]:
    found = []
    for n, cell in enumerate(code_cells(load(path))):
        for k, line in enumerate(_text(cell["source"]).splitlines(), 1):
            if columns(line) > MAX_COLUMNS:
                found.append(
                    f"{path.name} code cell {n} line {k}: {columns(line)} columns"
                )
        for text in printed_texts(cell):
            for line in text.splitlines():
                if columns(line) > MAX_COLUMNS:
                    found.append(
                        f"{path.name} code cell {n} output: {columns(line)} columns:"
                        f" {line[:40]}..."
                    )
    return found


def test_the_width_check_counts_columns():
    assert columns("x" * 88) == 88
    assert columns("注意") == 4
    assert columns("█" * 10) == 10


def test_every_code_line_and_printed_line_fits_88_columns():
    found = [line for path in CHAPTERS for line in too_wide(path)]
    assert found == [], (
        f"{len(found)} lines wider than {MAX_COLUMNS} columns:\n"
        + "\n".join(found[:40])
    )


# --- Figure text sizes in the chapters' code ------------------------------------------
TEXT_CALLS = {
    "text",
    "annotate",
    "set_title",
    "set_xlabel",
    "set_ylabel",
    "suptitle",
    "supxlabel",
    "supylabel",
    "title",
    "xlabel",
    "ylabel",
    "legend",
    "set_label",
    "figtext",
    "table",
    "clabel",
    "bar_label",
    "set_fontsize",
}
SIZE_KEYWORDS = {"fontsize", "labelsize", "title_fontsize"}


def points(node: ast.AST) -> float | None:
    """The size in points that a literal font size gives, or None when not a literal."""
    from matplotlib.font_manager import font_scalings

    if isinstance(node, ast.Constant):
        if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node.value, str) and node.value in font_scalings:
            return font_scalings[node.value] * COURSE_FONT_SIZE
    return None


def _python(source: str) -> str:
    """Cell source without IPython magics and shell escapes, so ast can parse it."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line
        for line in source.splitlines()
    )


def small_font_sizes(source: str) -> list[tuple[int, str, float]]:
    """(line, what, points) of every literal font size below 8 pt in ``source``."""
    found = []
    for node in ast.walk(ast.parse(_python(source))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            for kw in node.keywords:
                size = None
                if kw.arg in SIZE_KEYWORDS or (kw.arg == "size" and name in TEXT_CALLS):
                    size = points(kw.value)
                elif kw.arg == "prop" and isinstance(kw.value, ast.Dict):
                    size = _dict_size(kw.value)
                if size is not None and size < MIN_POINTS:
                    found.append((node.lineno, f"{name}({kw.arg}=...)", size))
            if name == "update" and node.args and isinstance(node.args[0], ast.Dict):
                for key, value in zip(node.args[0].keys, node.args[0].values):
                    if (
                        _is_size_key(key)
                        and (p := points(value)) is not None
                        and p < MIN_POINTS
                    ):
                        found.append((node.lineno, f"rcParams {key.value}", p))
        elif isinstance(node, ast.Assign) and isinstance(
            node.targets[0], ast.Subscript
        ):
            key = node.targets[0].slice
            if (
                _is_size_key(key)
                and (p := points(node.value)) is not None
                and p < MIN_POINTS
            ):
                found.append((node.lineno, f"rcParams {key.value}", p))
    return sorted(found)


def _dict_size(node: ast.Dict) -> float | None:
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant) and key.value == "size":
            return points(value)
    return None


def _is_size_key(key) -> bool:
    return (
        isinstance(key, ast.Constant)
        and isinstance(key.value, str)
        and key.value.endswith("size")
        and key.value.split(".")[0]
        in {"font", "axes", "xtick", "ytick", "legend", "figure"}
    )


def test_the_font_size_check_finds_small_text():
    src = (
        "ax.legend(fontsize=7)\nax.text(0, 0, 's', size='x-small')\n"
        "ax.tick_params(labelsize=6)\nplt.rcParams['legend.fontsize'] = 5\n"
        "ax.legend(prop={'size': 6})\nplt.rcParams.update({'font.size': 7})\n"
        "ax.set_title('t', fontsize=8)\nax.legend(fontsize='small')\n"
        "torch.randn(3, size=4)\n%matplotlib inline\n"
    )
    assert [(line, size) for line, _, size in small_font_sizes(src)] == [
        (1, 7.0),
        (2, pytest.approx(6.94, abs=0.01)),
        (3, 6.0),
        (4, 5.0),
        (5, 6.0),
        (6, 7.0),
    ]


@pytest.mark.slow  # parses every chapter: make test, not make check
def test_no_chapter_sets_figure_text_below_8_points():
    found = []
    for path in CHAPTERS:
        for n, cell in enumerate(code_cells(load(path))):
            for line, what, size in small_font_sizes(_text(cell["source"])):
                found.append(
                    f"{path.name} code cell {n} line {line}: {what} is {size:.3g} pt"
                )
    assert found == [], "text below 8 pt:\n" + "\n".join(found)
