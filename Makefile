# Two commands do all the set-up on a fresh machine:
#   make run    create .venv, install fedsim, run the default scenario end to end
#   make test   create .venv, install fedsim with test extras, run the test suite
#
# TORCH picks the PyTorch build. The default pins the CPU build that this project is developed on,
# so that no CUDA packages are downloaded. With a GPU: make run TORCH=torch   (or any torch spec).
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
SCENARIO ?= quickstart
ARGS ?=

BIN := $(VENV)/bin
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export FLWR_TELEMETRY_ENABLED ?= 0
export FLWR_DISABLE_UPDATE_CHECK ?= 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION ?= 1

.PHONY: install install-test run test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH)" -e .
	touch $@

$(VENV)/.installed-test: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH)" -e ".[test]"
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

run: install
	$(BIN)/fedsim run $(SCENARIO) $(ARGS)

test: install-test
	$(BIN)/python -m pytest -q $(ARGS)

lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: install
	$(BIN)/python benchmarks/privacy.py

clean:
	rm -rf $(VENV) build dist *.egg-info
