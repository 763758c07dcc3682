# The README's two commands: `make up` (gateway plus a local engine) and
# `make test` (lint and the whole test suite). Both build .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: up test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Reinstalled only when the project's dependencies change.
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

lint: $(VENV)/.dev
	$(BIN)/ruff check .

test: lint
	$(BIN)/pytest

up: $(VENV)/.dev
	$(BIN)/autellix up

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
