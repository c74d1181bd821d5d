# The two commands of the README:
#   make book  - build the HTML book into _build/html (creates .venv and installs on first use)
#   make lab   - open the chapters in JupyterLab from the project's environment
#   make test  - every check: unit/property tests, nbval over all chapters, the book build
#                with warnings as errors, and browser checks of the built pages
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: book test lab install mathjax clean

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

# Open the chapters in JupyterLab, in the project's environment (the package importable).
# Jupyter refuses to run as root unless told to (containers, CI): allow it there.
lab: install
	$(BIN)/jupyter lab chapters/ $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf _build
