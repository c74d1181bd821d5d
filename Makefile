# Two commands build and check everything (README, "Commands"):
#   make book   - build the HTML book into _build/html (creates .venv and installs on first use)
#   make test   - every check: lint, the book build with warnings as errors, pytest --nbval
#                 (unit tests, doctests, launches, browser checks, every chapter), every chapter
#                 under other numerics, and the unit tests and chapters again under a second
#                 PyTorch release (scripts/test.sh)
# Two more are optional:
#   make check  - the quick loop while editing the package (about 50 s on 2 cores):
#                 ruff check and ruff format --check, pyright over src, and the unit tests
#                 and doctests not marked slow (no npm, no Chromium, no book, no chapters)
#   make lab    - open the chapters and the workbook in JupyterLab from the project's environment
#                 (installs the package on first use; no npm needed)
# Everything is installed with the exact versions of requirements/ci-lock.txt (regenerate it
# with scripts/lock.sh); pyproject.toml itself declares ranges.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
LOCK := requirements/ci-lock.txt

.PHONY: book test check types unit lab install mathjax clean

install: $(INSTALLED) book/_static/mathjax/.version

# The package with its dev and triton extras, every version taken from the lock
# (PyTorch 2.13.0's CPU wheel, the oldest release the course supports).
$(INSTALLED): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c $(LOCK) --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(LOCK) -e '.[dev,triton]'
	touch $@

book/_static/mathjax/.version: scripts/vendor_mathjax.sh
	bash scripts/vendor_mathjax.sh

mathjax: book/_static/mathjax/.version

book: install
	$(BIN)/jupyter-book build . --all -W -n --keep-going

test: install
	bash scripts/test.sh

# The Python files ruff holds to its rules and its format (scripts/test.sh: the same).
PY_FILES := src tests benchmarks scripts typings book/_ext

# No MathJax, no Chromium, no book and no chapters: the linters, the type checker, and
# the package's tests and docstring examples except those marked slow (pyproject.toml);
# the launch tests, which start JupyterLab and install into fresh environments, the
# browser tests and the slow ones are left to `make test`. pyright runs beside the
# tests (make -j2), the two together filling the two cores.
check: $(INSTALLED)
	$(BIN)/ruff check $(PY_FILES)
	$(BIN)/ruff format --check $(PY_FILES)
	$(MAKE) --no-print-directory -j2 --output-sync=target types unit

types: $(INSTALLED)
	$(BIN)/pyright

# nbval is not loaded (-p no:nbval; addopts is restated without its options): its
# import alone costs each test process about 3 s of CPU. Property tests draw 20 examples
# each here (the "check" profile of tests/conftest.py), 60 under make test.
unit: $(INSTALLED)
	HYPOTHESIS_PROFILE=check $(BIN)/python -m pytest -q -n 2 -m "not slow" -p no:nbval \
	  -o addopts="-p no:cacheprovider -p no:logging --strict-markers --doctest-modules" \
	  tests src/attention --ignore=tests/browser --ignore=tests/test_reader_launch.py

# Open JupyterLab on the chapters and the workbook, in the project's environment (the
# package importable). Its file browser starts at the repository's root, where chapters/
# and workbook/ (the chapters with their exercise solutions as stubs to fill in, written
# by scripts/make_workbook.py) sit side by side.
# Jupyter refuses to run as root unless told to (containers, CI): allow it there.
lab: $(INSTALLED)
	$(BIN)/jupyter lab --ServerApp.root_dir=. $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf _build
