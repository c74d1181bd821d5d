#!/usr/bin/env bash
# Every check the project has, in the order a reader would trust them. Run via `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PYTHONHASHSEED=0
elapsed() { echo "($1 took $(( $(date +%s) - $2 )) s)"; }

echo "== 1. lint: ruff check"
$BIN/ruff check src tests benchmarks scripts

echo "== 2. the book, built with warnings as errors"
start=$(date +%s)
$BIN/jupyter-book build . --all -W -n --keep-going
elapsed "book build" "$start"

echo "== 3. pytest --nbval: unit, property and notebook-structure tests, docstring examples,"
echo "      JupyterLab and simulated-Colab launches, browser checks of the built pages,"
echo "      and every chapter re-executed and compared (options in pyproject.toml)"
bash scripts/ensure_chromium.sh
start=$(date +%s)
COURSE_REQUIRE_BROWSER=1 $BIN/python -m pytest --nbval -n 2 --dist loadfile
elapsed "pytest --nbval" "$start"

echo "== 4. every chapter again, computed as another machine would: PyTorch's plain C++"
echo "      kernels, MKL's compatible code path, and flush-to-zero in the kernel"
start=$(date +%s)
bash scripts/nbval_numerics.sh other -n 2 --dist loadfile chapters
elapsed "nbval on other numerics" "$start"
