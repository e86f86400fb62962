# Two entry points: `make start` runs the engine, `make test` runs the tests.
# Both create ./.venv and install what they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: start test setup bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

start: $(STAMP)
	$(PY) -m supervisor start --store-dir $(or $(STORE),store)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) *.egg-info
