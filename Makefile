# Two commands set everything up on a fresh machine:
#   make demo   creates .venv, installs gpuyantra, runs `gpuyantra demo` on the embedded defaults
#   make test   creates .venv, installs gpuyantra with its test extras, runs the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install clean

# constraints.txt pins every version (torch included), so a fresh clone installs what was tested.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpuyantra demo --state-dir .state

# -n: pytest-xdist worker processes; more than a 2-core machine's cores, since the integration tests
# mostly wait on the servers and workers they start. --dist loadgroup: the tests of a module that share
# a fixture wider than one test (a server, a model, the Temporal dev server) go to one worker together,
# so it starts once (tests/conftest.py groups them); every other test goes to whichever worker is free.
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 4
XDIST := -n $(TEST_WORKERS) --dist loadgroup

# --durations: the slowest tests, listed after every run, so the suite's time stays in view.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) --durations=25

# ruff (lint and format) and mypy, configured in pyproject.toml; CI runs it before the tests.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Unit tests only: no Temporal server, no serving processes, nothing run end to end in Triton's
# interpreter (the `slow` modules listed in tests/conftest.py).
test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not integration and not slow" --durations=10

clean:
	rm -rf $(VENV) .state
