# `make demo` and `make test` work on a fresh machine with Python 3.11+, pip and make.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
comma := ,
# The CUDA extra only where a GPU driver is present; the CPU install never needs it.
GPU_EXTRA := $(if $(shell command -v nvidia-smi 2>/dev/null),cuda13,)
EXTRAS := test$(if $(GPU_EXTRA),$(comma)$(GPU_EXTRA),)

.PHONY: demo test lint docs format clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/dask-gpudirect demo

test: $(VENV)/.installed lint docs
	$(PY) -m pytest -q -ra tests

# The site, from scratch each time (autosummary's pages too), into docs/_build/html.
docs: $(VENV)/.installed
	rm -rf docs/_build docs/generated
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check dask_gpudirect tests examples
	$(VENV)/bin/ruff format --check dask_gpudirect tests examples
	$(VENV)/bin/mypy  # the package, as [tool.mypy] in pyproject.toml says

format: $(VENV)/.installed
	$(VENV)/bin/ruff format dask_gpudirect tests examples
	$(VENV)/bin/ruff check --fix dask_gpudirect tests examples

clean:
	rm -rf $(VENV) demo-data docs/_build docs/generated
