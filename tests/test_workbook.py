"""The workbook (scripts/make_workbook.py): committed up to date, stubs a reader fills.

The workbook notebooks are generated from the chapters' ``solution`` cells; the first
test fails when a chapter changed and ``workbook/`` was not regenerated. The others run
the generator on a small synthetic chapter: the stub keeps the ``def`` line and the
docstring, the output is deterministic, and executed in a real Jupyter kernel, a filled
stub passes its checker while a stub left as it is fails with one line naming it and no
frame of the checker's code.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_workbook = _script("make_workbook")
colab_cell = _script("colab_cell")

SOLUTION = '''import torch


def my_softmax(x, dim=-1):
    """Softmax of x along dim, from its formula."""
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)
'''

STUB = '''import torch


def my_softmax(x, dim=-1):
    """Softmax of x along dim, from its formula."""
    raise NotImplementedError("write your solution here")
'''


def _cell(kind: str, source: str, tags=(), cid="", **metadata) -> dict:
    cell = {
        "cell_type": kind,
        "id": cid,
        "metadata": {**metadata, **({"tags": list(tags)} if tags else {})},
        "source": source.splitlines(keepends=True),
    }
    if kind == "code":
        cell["execution_count"] = 7
        cell["outputs"] = [
            {"name": "stdout", "output_type": "stream", "text": ["old\n"]}
        ]
        cell["metadata"]["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    return cell


def synthetic_chapter() -> dict:
    """A chapter with one exercise the reader writes and one answered by computing."""
    install = colab_cell.install_cell()
    install["id"] = "install"
    prompts = {"code_prompt_show": "Show solution", "code_prompt_hide": "Hide solution"}
    return {
        "cells": [
            _cell("markdown", "# 2. Softmax\n\nA chapter.", cid="title"),
            install,
            _cell(
                "code",
                "import torch\nfrom attention.exercises import ch02",
                cid="setup",
            ),
            _cell("markdown", "## Exercises\n\n### Exercise 1: softmax", cid="ex1"),
            _cell(
                "code",
                SOLUTION,
                ["solution", "hide-cell"],
                cid="solution",
                mystnb=prompts,
            ),
            _cell("code", "ch02.check_softmax(my_softmax)", cid="checker"),
            _cell("markdown", "### Exercise 2: a sum", cid="ex2"),
            _cell(
                "code", "assert 1 + 1 == 2\nprint('ok')", ["hide-cell"], cid="computed"
            ),
        ],
        "metadata": {
            "kernelspec": {"name": "python3"},
            "language_info": {"version": "3"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def _by_id(nb: dict, cid: str) -> dict:
    return next(c for c in nb["cells"] if c["id"] == cid)


# --------------------------------------------------------------------------- committed


def test_the_committed_workbook_is_up_to_date():
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_workbook.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


# --------------------------------------------------------------------------- generation


def test_a_solution_cell_becomes_a_stub_with_its_def_and_docstring():
    nb = make_workbook.workbook_notebook(synthetic_chapter(), "synthetic")
    stub = _by_id(nb, "solution")
    assert "".join(stub["source"]) == STUB
    assert stub["metadata"] == {}  # solution and hide-cell tags, prompts: all dropped
    computed = _by_id(nb, "computed")  # an exercise answered by computing: kept
    assert computed["metadata"] == {"tags": ["hide-cell"]}
    assert "".join(computed["source"]) == "assert 1 + 1 == 2\nprint('ok')"


def test_outputs_counts_and_timings_are_removed_and_the_colab_cell_leads():
    nb = make_workbook.workbook_notebook(synthetic_chapter(), "synthetic")
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    assert all("execution" not in c["metadata"] for c in nb["cells"])
    assert "".join(code[0]["source"]) == colab_cell.SOURCE
    assert code[0]["metadata"] == colab_cell.METADATA
    assert nb["cells"][0]["id"] == "title" and nb["cells"][1]["id"] == "workbook-note"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


def test_the_output_is_deterministic_and_stable_json():
    chapter = synthetic_chapter()
    first = make_workbook.render(make_workbook.workbook_notebook(chapter, "x"))
    again = make_workbook.render(
        make_workbook.workbook_notebook(copy.deepcopy(chapter), "x")
    )
    assert first == again
    assert (
        first
        == json.dumps(json.loads(first), indent=1, sort_keys=True, ensure_ascii=False)
        + "\n"
    )


def test_stubs_of_several_definitions_a_decorator_and_a_class():
    source = (
        "import math\nimport torch\n\n\n@torch.no_grad()\ndef f(\n    x,\n):\n"
        '    """F."""\n    return x\n\n\ndef g(x):\n    return f(x) + math.pi\n\n\n'
        'class Head:\n    """A head."""\n\n    def __init__(self):\n'
        "        self.w = 1\n"
    )
    assert make_workbook.stub_source(source) == (
        "import math\nimport torch\n\n\n@torch.no_grad()\ndef f(\n    x,\n):\n"
        '    """F."""\n    raise NotImplementedError("write your solution here")\n\n\n'
        'def g(x):\n    raise NotImplementedError("write your solution here")\n\n\n'
        'class Head:\n    """A head."""\n\n    def __init__(self):\n'
        '        raise NotImplementedError("write your solution here")\n'
    )


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("def f(x):\n    return x\n\nprint(f(1))\n", "move line 4"),
        ("def f(x): return x\n", "on its own lines"),
        ("import torch\n", "must define the reader's function"),
        ("%time def f(x):\n    return x\n", "must be plain Python"),
    ],
)
def test_a_solution_cell_that_cannot_be_stubbed_is_refused_with_where(source, fragment):
    with pytest.raises(make_workbook.WorkbookError, match=fragment) as caught:
        make_workbook.stub_source(source, "chapters/02_softmax.ipynb cell 5")
    assert str(caught.value).startswith("chapters/02_softmax.ipynb cell 5: ")


def test_check_mode_names_missing_stale_and_left_over_files(tmp_path):
    chapters, workbook = tmp_path / "chapters", tmp_path / "workbook"
    chapters.mkdir()
    (chapters / "02_softmax.ipynb").write_text(json.dumps(synthetic_chapter()))
    no_exercise = synthetic_chapter()
    no_exercise["cells"] = no_exercise["cells"][:3]
    (chapters / "03_scaling.ipynb").write_text(json.dumps(no_exercise))
    check = ["--check", "--chapters", str(chapters), "--workbook", str(workbook)]
    assert make_workbook.stale_files(chapters, workbook) == [
        "02_softmax.ipynb (missing)"
    ]
    assert make_workbook.main(check) == 1
    make_workbook.main(["--chapters", str(chapters), "--workbook", str(workbook)])
    assert sorted(p.name for p in workbook.iterdir()) == ["02_softmax.ipynb"]
    assert make_workbook.main(check) == 0
    changed = synthetic_chapter()
    changed["cells"][0]["source"] = ["# 2. Softmax, renamed"]
    (chapters / "02_softmax.ipynb").write_text(json.dumps(changed))
    (workbook / "09_old.ipynb").write_text("{}")
    assert make_workbook.stale_files(chapters, workbook) == [
        "02_softmax.ipynb (out of date)",
        "09_old.ipynb (no chapter with solution cells)",
    ]


# ------------------------------------------------------------------------ a real kernel


def _execute(nb: dict, tmp_path: Path) -> dict:
    """Run the notebook in a fresh Jupyter kernel, errors kept as outputs."""
    import nbformat
    from nbclient import NotebookClient

    node = nbformat.reads(json.dumps(nb), as_version=4)
    NotebookClient(
        node,
        timeout=120,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    return json.loads(nbformat.writes(node))


def _filled(nb: dict) -> dict:
    """The workbook as a reader leaves it: each stub's body written."""
    nb = copy.deepcopy(nb)
    stub = _by_id(nb, "solution")
    stub["source"] = SOLUTION.splitlines(keepends=True)
    return nb


@pytest.mark.slow  # a Jupyter kernel started: make test, not make check
def test_a_filled_workbook_passes_its_checker_in_a_kernel(tmp_path):
    nb = make_workbook.workbook_notebook(synthetic_chapter(), "synthetic")
    done = _execute(_filled(nb), tmp_path)
    outputs = _by_id(done, "checker")["outputs"]
    assert [o["output_type"] for o in outputs] == ["stream"], outputs
    assert "".join(outputs[0]["text"]).startswith("✓ my_softmax: softmax along dim")


@pytest.mark.slow  # a Jupyter kernel started: make test, not make check
def test_a_stub_left_fails_its_checker_with_one_line_and_no_checker_frames(tmp_path):
    nb = make_workbook.workbook_notebook(synthetic_chapter(), "synthetic")
    done = _execute(nb, tmp_path)
    (error,) = _by_id(done, "checker")["outputs"]
    assert error["output_type"] == "error"
    assert error["ename"] == "ExerciseError"
    assert error["evalue"] == (
        "my_softmax is still a stub: replace `raise NotImplementedError` with your code"
    )
    shown = "\n".join(error["traceback"])
    assert len(error["traceback"]) == 1 and error["evalue"] in shown
    assert "_checker.py" not in shown and "ch02.py" not in shown
