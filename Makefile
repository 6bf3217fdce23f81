# `make train` and `make test` set up .venv on first use (CPU torch pinned for a quick install;
# on a GPU machine use TORCH_SPEC="torch>=2.11" EXTRAS=dev, since CUDA torch brings its own
# Triton, or an existing environment with PYTHON=...).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,triton-interpreter,ft

.PHONY: train test test-all lint
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

train: $(VENV)/.installed
	PYTHON=$(PY) ./run_train.sh $(ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 --dist worksteal -m "not slow" tests

test-all: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 --dist worksteal tests

lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check . && $(VENV)/bin/ruff check .
