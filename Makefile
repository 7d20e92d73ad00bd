# Two entry points: `make demo` and `make test`. Each creates .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py sidecar/_fastrelay.c | sha1sum | cut -c1-12)

.PHONY: demo test test-fast venv clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, exactly this version: the CPU wheel on this disk. A looser pin pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0

$(STAMP): $(BIN)/python pyproject.toml setup.py sidecar/_fastrelay.c
	$(BIN)/pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/goodput demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m 'not slow'

clean:
	rm -rf $(VENV) .pytest_cache
