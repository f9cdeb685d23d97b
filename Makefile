# Two commands for a fresh machine:
#   make demo   set up .venv and run the built-in default experiment
#   make test   set up .venv (with test and model-parity extras) and run the tests
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
# Test workers: one per core by default (CI has 2).
WORKERS ?= 2

.PHONY: demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.demo-installed: $(PY) setup.cfg pyproject.toml
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.test-installed: $(PY) setup.cfg pyproject.toml
	$(PIP) install --quiet -e ".[test,models]"
	touch $@

demo: $(VENV)/.demo-installed
	$(PY) scripts/demo.py --config=configs/demo.py

test: $(VENV)/.test-installed
	$(PY) -m pytest -n $(WORKERS) tests

bench: $(VENV)/.test-installed
	$(PIP) install --quiet -e ".[bench]"
	$(PY) benchmarks/solver_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
