# Two entry points: `make start` runs the engine, `make test` runs the tests.
# Both create ./.venv and install what they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: start test setup system-tools bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

start: $(STAMP)
	$(PY) -m supervisor start --store-dir $(or $(STORE),store)

# Fault-injection tests use strace (fsync failures); install it when we can.
system-tools:
	@command -v strace >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && (apt-get update -qq && apt-get install -y -qq strace >/dev/null) || echo "note: strace missing; its tests skip"; }

test: $(STAMP) system-tools
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) *.egg-info
