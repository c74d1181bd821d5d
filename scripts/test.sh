#!/usr/bin/env bash
# Every check the project has, in the order a reader would trust them. Run via `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PYTHONHASHSEED=0
elapsed() { echo "($1 took $(( $(date +%s) - $2 )) s)"; }

# The chapters the second PyTorch re-executes (all of them would not fit CI's 20 minutes
# once the course has 20 chapters): numerics (2), PyTorch's nn.MultiheadAttention and SDPA
# (6), Hugging Face's model (17), FlexAttention and the KV caches (18). The README lists
# the same ones (tests/test_reader_launch.py checks it).
TORCH_NEXT_CHAPTERS="chapters/02_softmax.ipynb chapters/06_multi_head.ipynb chapters/17_pretrained_model.ipynb chapters/18_llm_inference.ipynb"

# The Python files ruff holds to its rules and its format (the Makefile's PY_FILES).
PY_FILES="src tests benchmarks scripts typings book/_ext"

# The second environment (step 4) is made in the background while steps 1 to 3 run:
# pip's downloads and installs overlap with the linters, the book build and the chapters.
next_dir=$(mktemp -d)
bash scripts/torch_next_env.sh > "$next_dir/path" 2> "$next_dir/log" &
next_pid=$!
next_start=$(date +%s)
# if an earlier step fails, stop the install too (its stamp is written last, so a
# half-made environment is never reused)
trap 'pkill -P "$next_pid" 2>/dev/null || true; kill "$next_pid" 2>/dev/null || true' EXIT

echo "== 1. lint and types: ruff check, ruff format --check, pyright (basic) over src"
# shellcheck disable=SC2086
$BIN/ruff check $PY_FILES
# shellcheck disable=SC2086
$BIN/ruff format --check $PY_FILES
$BIN/pyright

echo "== 2. the book, built with warnings as errors"
start=$(date +%s)
$BIN/jupyter-book build . --all -W -n --keep-going
elapsed "book build" "$start"

echo "== 3. pytest --nbval: every chapter re-executed and compared, computed as another"
echo "      machine would: PyTorch's plain C++ kernels, MKL's compatible code path and"
echo "      flush-to-zero in the kernel (the same code path on Intel and AMD)"
# Each chapter runs once in CI, under these numerics: running all twenty under the
# machine's own numerics as well would take CI past its 20 minutes on two cores.
# `pytest --nbval chapters` runs them under the machine's own.
start=$(date +%s)
bash scripts/nbval_numerics.sh other -n 2 --dist loadfile chapters
elapsed "nbval on other numerics" "$start"

echo "== 4. a second environment with the newer PyTorch of requirements/ci-lock-torch-next.txt"
echo "      (created once, reused while the lock and pyproject.toml are unchanged; made in"
echo "      the background since step 1)"
if ! wait "$next_pid"; then
  cat "$next_dir/log" >&2
  echo "the second environment could not be made (scripts/torch_next_env.sh)" >&2
  exit 1
fi
start=$next_start
COURSE_TORCH_NEXT_VENV=$(cat "$next_dir/path")
export COURSE_TORCH_NEXT_VENV COURSE_REQUIRE_TORCH_NEXT=1
NEXT=$COURSE_TORCH_NEXT_VENV/bin
$NEXT/python -c 'import torch; print("torch", torch.__version__, "in", torch.__file__)'
elapsed "second environment" "$start"

echo "== 5. pytest: unit, property and notebook-structure tests (the slow ones too),"
echo "      docstring examples, JupyterLab and simulated-Colab launches, browser checks"
echo "      of the built pages, every benchmark script at smoke sizes"
bash scripts/ensure_chromium.sh
start=$(date +%s)
COURSE_REQUIRE_BROWSER=1 $BIN/python -m pytest --nbval -n 2 --dist loadfile tests src/attention
elapsed "pytest (tests and doctests)" "$start"

echo "== 6. the second PyTorch: the kernel contract, SDPA, softmax, mask and multi-head"
echo "      tests not marked slow, and chapters $TORCH_NEXT_CHAPTERS"
start=$(date +%s)
# The PyTorch APIs whose behaviour a release may change: torch's fused SDPA and
# nn.MultiheadAttention against the package, softmax numerics, FlexAttention and the KV
# caches (chapter 18), Hugging Face's model (chapter 17). The rest of the tests run in
# step 5; step 5's launch tests also install a chapter beside this PyTorch.
# shellcheck disable=SC2086
$NEXT/python -m pytest --nbval -n 2 --dist loadfile -m "not slow" \
  tests/test_contract.py tests/test_scaled_dot_product.py tests/test_multihead.py \
  tests/test_softmax.py tests/test_masks.py $TORCH_NEXT_CHAPTERS
elapsed "pytest --nbval under the second PyTorch" "$start"
