#!/usr/bin/env bash
# Every check the project has, in the order a reader would trust them. Run via `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PYTHONHASHSEED=0

echo "== 1-2. unit and property tests, docstring examples, and every chapter re-executed under nbval"
start=$(date +%s)
$BIN/python -m pytest tests chapters src/attention --ignore=tests/browser --doctest-modules \
  --nbval --nbval-current-env --nbval-sanitize-with tests/sanitize.cfg
echo "(tests and nbval took $(( $(date +%s) - start )) s)"

echo "== 3. the book, built with warnings as errors"
start=$(date +%s)
$BIN/jupyter-book build . --all -W -n --keep-going
echo "(book build took $(( $(date +%s) - start )) s)"

echo "== 4. the built pages in a headless browser, network cut"
bash scripts/ensure_chromium.sh
$BIN/python -m pytest tests/browser
