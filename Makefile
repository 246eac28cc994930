# Two commands do all the set-up on a fresh machine:
#   make run    create .venv, install fedsim, run the default scenario end to end
#   make test   create .venv, install fedsim with test extras, run the test suite
#   make docs   build the documentation site into docs/_build/html (warnings are errors)
#
# TORCH picks the PyTorch version (default: the one this project is developed and tested on), TORCH_INDEX an extra
# package index for its build. Which build pip takes depends on the machine's package sources: on Linux, PyPI's
# torch==2.13.0 wheel is a CUDA build (several GB of nvidia packages); for the CPU-only build, point TORCH_INDEX at
# PyTorch's CPU index:  make run TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (the development machine's pip configuration already serves the CPU wheel). Any torch: make run TORCH=torch
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
TORCH_INDEX ?=
SCENARIO ?= quickstart
ARGS ?=

BIN := $(VENV)/bin
PIP_TORCH := "$(TORCH)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export FLWR_TELEMETRY_ENABLED ?= 0
export FLWR_DISABLE_UPDATE_CHECK ?= 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION ?= 1

.PHONY: install install-test install-docs run test lint docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet $(PIP_TORCH) -e .
	touch $@

$(VENV)/.installed-test: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet $(PIP_TORCH) -e ".[test]"
	touch $(VENV)/.installed $@

$(VENV)/.installed-docs: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet $(PIP_TORCH) -e ".[docs]"
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test
install-docs: $(VENV)/.installed-docs

run: install
	$(BIN)/fedsim run $(SCENARIO) $(ARGS)

test: install-test
	$(BIN)/python -m pytest -q $(ARGS)

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The documentation site, offline, with every warning an error (a broken link or reference fails the build).
# Open docs/_build/html/index.html in a browser.
docs: install-docs
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

bench: install
	$(BIN)/python benchmarks/privacy.py

clean:
	rm -rf $(VENV) build dist *.egg-info docs/_build
