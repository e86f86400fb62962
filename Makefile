# Two entry points: `make start` runs the engine, `make test` runs the tests.
# Both create ./.venv and install what they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: start test lint setup system-tools clients bench clean

# The install also compiles engine/_codec.c (the hot loops) when gcc and zlib's headers are there;
# without them the engine runs on the Python codec, slower.
$(STAMP): pyproject.toml setup.py engine/_codec.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

# The tests also need pytest and the Spark connector's extra (pyspark, pyarrow; Java 17 on PATH).
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(TEST_STAMP)

setup: $(TEST_STAMP)

start: $(STAMP)
	$(PY) -m supervisor start --store-dir $(or $(STORE),store)

# Fault-injection tests use strace (fsync failures), and the dashboard's test drives headless
# Chromium through ChromeDriver (Debian's chromium and chromium-driver); install them when we can.
SYSTEM_PACKAGES := strace chromium chromium-driver
system-tools:
	@command -v strace >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && (apt-get update -qq && apt-get install -y -qq --no-install-recommends $(SYSTEM_PACKAGES) >/dev/null) \
	  || echo "note: $(SYSTEM_PACKAGES) not all installed; the tests that need them skip"; }

# The C and Node clients and their conformance drivers (tests/conformance), and the official
# RocketMQ 5 Node client of examples/rocketmq5 (tests/grpc).
C_PACKAGES := gcc libc6-dev make pkg-config libzmq3-dev libmsgpuck-dev
clients:
	@pkg-config --exists libzmq && [ -f /usr/include/msgpuck.h ] && command -v cc >/dev/null || { \
	  [ "$$(id -u)" = 0 ] || { echo "install: apt-get install $(C_PACKAGES)"; exit 1; }; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends $(C_PACKAGES) >/dev/null; }
	$(MAKE) -s -C clients/c
	@command -v npm >/dev/null || { echo "the Node client needs node and npm (Node 18 or later)"; exit 1; }
	cd clients/node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	cd examples/rocketmq5 && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error

# Lint and types are part of the tests: ruff's rules and mypy's settings are in pyproject.toml.
lint: $(TEST_STAMP)
	$(PY) -m ruff check engine supervisor rmqpy tests scripts
	$(PY) -m mypy engine supervisor rmqpy

test: $(TEST_STAMP) system-tools clients lint
	@$(PY) -c 'import engine.codec as c; assert c.COMPILED, "engine/_codec.c did not build: gcc and zlib1g-dev needed"'
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) *.egg-info
