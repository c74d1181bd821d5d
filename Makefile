# The two commands of the README:
#   make book  - build the HTML book into _build/html (creates .venv and installs on first use)
#   make test  - every check: unit/property tests, nbval over all chapters, the book build
#                with warnings as errors, and browser checks of the built pages
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: book test install mathjax clean

install: $(INSTALLED) book/_static/mathjax/.version

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

book/_static/mathjax/.version: scripts/vendor_mathjax.sh
	bash scripts/vendor_mathjax.sh

mathjax: book/_static/mathjax/.version

book: install
	$(BIN)/jupyter-book build . --all -W -n --keep-going

test: install
	bash scripts/test.sh

clean:
	rm -rf _build
