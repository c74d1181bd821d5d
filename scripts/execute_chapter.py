"""Execute chapters top to bottom in a fresh kernel and store them, streams coalesced.

    .venv/bin/python scripts/execute_chapter.py chapters/NN_name.ipynb [more.ipynb ...]
    .venv/bin/python scripts/execute_chapter.py --no-execute chapters/*.ipynb # coalesce
    only

Each chapter runs as `jupyter nbconvert --to notebook --execute --inplace` would run it:
a new kernel of the notebook's kernelspec, started in the chapter's folder (set
PYTHONPATH=src to run a checkout's package). Then its outputs are cleaned as nbconvert's
`coalesce_streams` preprocessor cleans them:

- consecutive outputs of one stream (stdout or stderr) become one output, so a cell that
  flushed a hundred times stores one block;
- a carriage return starts its line again, as a terminal shows it: only the text after
  the last one survives, so a tqdm bar leaves its final frame and no other; a backspace
  erases the character before it.

nbval compares outputs after the same merging, so the stored chapter still matches a
fresh run. tests/test_stored_chapters.py checks that every stored chapter is clean.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

_BACKSPACE = re.compile("[^\n\x08]\x08")  # a character, then a backspace


def clean_stream_text(text: str) -> str:
    """The text a terminal would show for ``text``: ``\\b`` and ``\\r`` applied.

    >>> clean_stream_text("\\r 10%|#   |\\r100%|####|\\n")
    '100%|####|\\n'
    >>> clean_stream_text("done\\r\\n")
    'done\\n'
    """
    previous = None
    while previous != text:  # two backspaces erase two characters
        previous, text = text, _BACKSPACE.sub("", text)
    lines = []
    for line in text.split("\n"):
        frames = [frame for frame in line.split("\r") if frame]
        lines.append(frames[-1] if frames else "")
    return "\n".join(lines)


def coalesce_streams(outputs: list) -> list:
    """Merge consecutive outputs of one stream and clean their text (see the module)."""
    merged: list = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (
            output.get("output_type") == "stream"
            and last is not None
            and last.get("output_type") == "stream"
            and last.get("name") == output.get("name")
        ):
            last["text"] = _text(last) + _text(output)
        else:
            merged.append(output)
    cleaned = []
    for output in merged:
        if output.get("output_type") == "stream":
            output["text"] = clean_stream_text(_text(output))
            if not output["text"]:
                continue
        cleaned.append(output)
    return cleaned


def _text(output) -> str:
    text = output.get("text", "")
    return "".join(text) if isinstance(text, list) else text


def coalesce_notebook(nb) -> int:
    """Coalesce every code cell's outputs in place; return how many outputs went."""
    removed = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.get("outputs"):
            before = len(cell.outputs)
            cell.outputs = coalesce_streams(cell.outputs)
            removed += before - len(cell.outputs)
    return removed


def execute(nb, path: Path, timeout: int | None) -> None:
    """Run ``nb`` top to bottom in a fresh kernel started in ``path``'s folder."""
    from nbclient import NotebookClient

    kernel = nb.metadata.get("kernelspec", {}).get("name", "python3")
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel,
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,  # no per-cell timestamps in the stored chapter
    ).execute()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument(
        "--no-execute", action="store_true", help="only coalesce the stored outputs"
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=None,
        help="seconds a cell may run (default: no limit)",
    )
    args = parser.parse_args(argv)
    import nbformat  # here, not at the top: its schema validator takes seconds

    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        if not args.no_execute:
            execute(nb, path, args.timeout)
        removed = coalesce_notebook(nb)
        for cell in nb.cells:  # timestamps an earlier run (or an editor) stored
            cell.metadata.pop("execution", None)
        nbformat.write(nb, path)
        done = "stored" if args.no_execute else "executed and stored"
        print(f"{path}: {done}, {removed} stream outputs merged or emptied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
