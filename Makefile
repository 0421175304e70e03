# The README's first two commands: `make demo` and `make test`. Both create .venv when missing and
# (re)install the project when setup.cfg changes: the pinned TF/TFRS/Beam stack and Airflow 3 in one
# venv (pip check passes), Horovod built from source for `make test`. pip's cache (~/.cache/pip) lives outside the clone,
# so a fresh clone installs from it in about a minute.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.recpipe-installed
PYTEST_ARGS ?=

.PHONY: install demo test test-fast docs bench horovod clean

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "recpipe needs Python 3.11 (TensorFlow 2.21 stack); set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)

$(STAMP): setup.cfg setup.py pyproject.toml scripts/system_deps.sh | $(BIN)/python
	@scripts/system_deps.sh
	@echo "installing recpipe and its pinned stack into $(VENV) (log: $(VENV)/pip-install.log)"
	@$(BIN)/pip install -e '.[dev,airflow,docs]' > $(VENV)/pip-install.log 2>&1 || { tail -40 $(VENV)/pip-install.log; exit 1; }
	@$(BIN)/pip check >> $(VENV)/pip-install.log 2>&1 || { tail -20 $(VENV)/pip-install.log; exit 1; }
	@touch $(STAMP)

# Horovod 0.28.1 built from source against TF 2.21 (~10 min once); the wheel is cached in
# ~/.cache/recpipe/wheels, so later venvs install it in seconds.
HVD_STAMP := $(VENV)/.horovod-installed
$(HVD_STAMP): $(STAMP) scripts/build_horovod.sh
	@scripts/build_horovod.sh $(BIN)
	@touch $(HVD_STAMP)

install: $(STAMP)

demo: install
	$(BIN)/recpipe demo

# Every tier (unit first); pytest.ini prints the 25 slowest tests.
test: install $(HVD_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The unit tier alone: no process, Beam job, training or Horovod, in a few minutes.
test-fast: install
	$(BIN)/python -m pytest -m unit $(PYTEST_ARGS)

# The documentation site into site/, warnings as errors (broken links, unknown pages, stale references).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench: install
	$(BIN)/recpipe bench

horovod: $(HVD_STAMP)

clean:
	rm -rf $(VENV) demo_out .pytest_cache site
