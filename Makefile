# Two commands for a fresh machine:
#   make demo   set up .venv and run the built-in default experiment
#   make test   set up .venv (with test, model-parity and browser extras) and run the tests
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
PIP     = $(PY) -m pip
# pytest-xdist workers: 2, the core count of CI; `make test WORKERS=8` on a bigger machine.
# --dist loadscope: each module runs on one worker, so a module fixture (a trained agent, a
# post-trained study, a browser session) is built once, not once per worker.
WORKERS ?= 2

.PHONY: demo test lint bench study estimators proxy text-agents clean browser java

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.demo-installed: $(PY) setup.cfg pyproject.toml
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.test-installed: $(PY) setup.cfg pyproject.toml
	$(PIP) install --quiet -e ".[test,models,browser,text,plots]"
	touch $@

# Headless Chromium for the real-browser tests (tests/envs/test_browser.py, docs/browser.md).
# As root (CI) it is installed from Debian when missing; otherwise those tests skip with a
# note, except under CI=true, where a missing browser fails them.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium and chromium-driver (apt-get)"; \
	  ( apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      chromium chromium-driver >/dev/null ) \
	  || { echo "apt-get install chromium chromium-driver failed"; [ "$$CI" != true ]; }; \
	else \
	  echo "note: chromium/chromedriver missing; browser tests skip" \
	       "(sudo apt-get install chromium chromium-driver)"; \
	fi

# A headless Java runtime for ScienceWorld (harnax.envs.text.scienceworld). As root it is
# installed from Debian when missing; otherwise the ScienceWorld tests skip with a note,
# except under CI=true, where a missing java fails them.
java:
	@if command -v java >/dev/null 2>&1; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing a headless Java runtime (apt-get install default-jre-headless)"; \
	  ( apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      default-jre-headless >/dev/null ) \
	  || { echo "apt-get install default-jre-headless failed"; [ "$$CI" != true ]; }; \
	else \
	  echo "note: java missing; ScienceWorld tests skip (sudo apt-get install default-jre-headless)"; \
	fi

demo: $(VENV)/.demo-installed
	$(PY) scripts/demo.py --config=configs/demo.py

# Lint first (ruff: pycodestyle, pyflakes, import order; config in pyproject.toml), then tests.
lint: $(VENV)/.test-installed
	$(VENV)/bin/ruff check harnax tests scripts benchmarks configs

test: lint browser java
	$(PY) -m pytest -n $(WORKERS) --dist loadscope --durations=20 tests

# The tabular MiniWoB++ study across harnesses H0-H5 (docs/harnesses.md).
study: $(VENV)/.test-installed
	$(PY) scripts/miniwob_study.py --config=configs/miniwob_study.py

# The estimator comparisons (docs/transfer_estimators.md) and the proxy-optimum validation
# (docs/estimation.md section 7) of the harness-transfer study.
estimators: $(VENV)/.test-installed
	$(PY) scripts/transfer_estimators.py --config=configs/transfer_estimators.py

proxy: $(VENV)/.test-installed
	$(PY) scripts/proxy_validation.py --config=configs/proxy_validation.py

# A text-game agent evaluated as the HAD paper does (docs/text_agents.md): by default the
# committed ALFWorld teacher (checkpoints/); `TEXT_CONFIG=configs/text_agents.py:student` its
# student; `TEXT_CONFIG=configs/text_agents.py:teacher_cpu` builds the CPU recipe first.
TEXT_CONFIG ?= configs/text_agents.py
text-agents: $(VENV)/.test-installed java
	$(PY) scripts/text_agents.py --config=$(TEXT_CONFIG)

bench: $(VENV)/.test-installed
	$(PY) benchmarks/solver_throughput.py
	$(PY) benchmarks/lm_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info

# HAD and its baselines (docs/had.md): the teacher distilled into the student by each method,
# evaluated under the four harness settings;
# `make had-study HAD_CONFIG=configs/distill.py:had,scienceworld`.
HAD_CONFIG ?= configs/distill.py:had
.PHONY: had-study
had-study: $(VENV)/.test-installed java
	$(PY) scripts/had_study.py --config=$(HAD_CONFIG)
