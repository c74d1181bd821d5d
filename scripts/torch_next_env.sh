#!/usr/bin/env bash
# Create (or reuse) the second-PyTorch environment: the package with its test and triton
# extras beside the PyTorch release of requirements/ci-lock-torch-next.txt (every version
# from that lock). Prints the environment's path.
#
#   COURSE_TORCH_NEXT_VENV   where it lives (default .venv/torch-next: inside the main
#                            environment's folder, so git, the book build and pytest skip it)
#
# The environment is rebuilt only when the lock or pyproject.toml changed since it was made,
# or the checkout moved (the package is installed editable, from this folder).
# PyTorch from the registry is a CUDA build (it runs on the CPU here): about 5.5 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
LOCK=requirements/ci-lock-torch-next.txt
venv=${COURSE_TORCH_NEXT_VENV:-.venv/torch-next}
stamp=$( (cat "$LOCK" pyproject.toml; pwd) | sha256sum | cut -c1-16)  # a moved checkout rebuilds: the install is editable
if [ -f "$venv/.installed" ] && [ "$(cat "$venv/.installed")" = "$stamp" ]; then
  echo "$venv"
  exit 0
fi
rm -rf "$venv"
$PYTHON -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet -c "$LOCK" --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet -c "$LOCK" torch -e '.[test,triton]' >&2
echo "$stamp" > "$venv/.installed"
echo "$venv"
