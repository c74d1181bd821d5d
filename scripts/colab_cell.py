"""Give every chapter the same first cell: install the course package where it is
missing.

On Colab (or any Jupyter without the course's environment) `attention` is not
importable, so the chapter's first code cell installs it from the repository; in the
course's own environment the cell does nothing and prints nothing. The cell is collapsed
in the HTML book. `ATTENTION_COURSE_SOURCE` overrides where pip installs from (a local
checkout, for tests/test_reader_launch.py).

The repository is named once, by `repository.url` in `_config.yml` (the book's launch
and repository buttons read it too): after changing it, run this script and commit the
chapters. pip keeps the reader's PyTorch when it is in the package's range
(`torch>=2.13` in pyproject.toml), so on Colab the cell installs the course package
beside the preinstalled PyTorch rather than over it.

    .venv/bin/python scripts/colab_cell.py          # insert or update, in place
    .venv/bin/python scripts/colab_cell.py --check  # exit 1 if a chapter lacks it
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def repository_url() -> str:
    """The repository the book is published from: `repository.url` in `_config.yml`."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url = (config.get("repository") or {}).get("url")
    if not isinstance(url, str) or not url.startswith("https://"):
        raise SystemExit(
            f"_config.yml: repository.url must be an https URL, got {url!r}"
        )
    return url.rstrip("/")


REPOSITORY = repository_url()

SOURCE = f"""\
# Running this chapter outside the course's environment (Colab, a bare Jupyter)?
# Then install the course package first; in the course's environment this does nothing.
import importlib
import importlib.util
import os
import subprocess
import sys

if importlib.util.find_spec("attention") is None:
    repository = "{REPOSITORY}"
    default = f"attention-course[pretrained] @ git+{{repository}}"
    source = os.environ.get("ATTENTION_COURSE_SOURCE", default)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", source]
    subprocess.run(pip, check=True)
    importlib.invalidate_caches()"""

METADATA = {
    "tags": ["hide-cell"],
    "mystnb": {
        "code_prompt_show": "Show the set-up cell (installs the package on Colab)",
        "code_prompt_hide": "Hide the set-up cell",
    },
}


def is_install_cell(cell: dict) -> bool:
    return cell["cell_type"] == "code" and "ATTENTION_COURSE_SOURCE" in "".join(
        cell["source"]
    )


def install_cell() -> dict:
    return {
        "cell_type": "code",
        "execution_count": None,
        "metadata": json.loads(json.dumps(METADATA)),
        "outputs": [],
        "source": SOURCE.splitlines(keepends=True),
    }


def first_code_index(cells: list[dict]) -> int:
    return next(n for n, c in enumerate(cells) if c["cell_type"] == "code")


def main(argv: list[str]) -> int:
    check = "--check" in argv
    missing = []
    for path in sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text())
        cells = nb["cells"]
        n = first_code_index(cells)
        meta = cells[n]["metadata"]
        ok = (
            is_install_cell(cells[n])
            and "".join(cells[n]["source"]) == SOURCE
            and all(meta.get(key) == value for key, value in METADATA.items())
        )
        if ok:
            continue
        missing.append(path.name)
        if check:
            continue
        if is_install_cell(cells[n]):
            kept = {k: cells[n][k] for k in ("id", "execution_count") if k in cells[n]}
            cells[n] = {**install_cell(), **kept}
        else:
            cells.insert(n, {**install_cell(), "id": "colab-install"})
        path.write_text(
            json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
        )
        print(f"updated {path.name} (re-execute it)")
    if check and missing:
        print("no install cell first in: " + ", ".join(missing))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
