# Two entry points: `make start` runs the engine, `make test` runs the tests.
# Both create ./.venv and install what they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: start test test-slow test-all lint setup build-tools system-tools clients clean

# Debian packages, installed when we are root and they are missing. BUILD_PACKAGES come before the
# install below (gcc and zlib's headers compile engine/_codec.c, the hot loops; without them the
# engine runs on the Python codec, slower). TEST_PACKAGES: libzmq and msgpuck for the C client, node
# and npm for the Node clients, strace for the fsync-failure tests, Chromium and ChromeDriver for the
# dashboard's browser test, bindfs and fuse3 for a store on a FUSE mount, etcd-server for the failover tests
# (a broker set elected on etcd). Without root, what is missing
# is named and the tests that need it skip.
BUILD_PACKAGES := gcc libc6-dev zlib1g-dev
TEST_PACKAGES := $(BUILD_PACKAGES) make pkg-config libzmq3-dev libmsgpuck-dev nodejs npm strace chromium \
	chromium-driver bindfs fuse3 etcd-server
define install_missing
	@if [ -n "$(strip $(1))" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian packages: $(2)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      $(2) >/dev/null || echo "note: apt-get could not install them all; what needs them is skipped"; \
	  else \
	    echo "note: missing $(strip $(1)) (as root: apt-get install $(2)); what needs them is skipped"; \
	  fi; \
	fi
endef
have = $(shell command -v $(1) >/dev/null 2>&1 || echo $(1))
have_file = $(shell [ -f $(1) ] || echo $(notdir $(1)))
build-tools:
	$(call install_missing,$(call have,cc) $(call have_file,/usr/include/zlib.h),$(BUILD_PACKAGES))
system-tools:
	$(call install_missing,$(foreach c,cc strace chromium chromedriver node npm pkg-config bindfs fusermount3 etcd,$(call have,$(c))) \
	  $(call have_file,/usr/include/zlib.h) $(call have_file,/usr/include/msgpuck.h) \
	  $(call have_file,/usr/include/zmq.h),$(TEST_PACKAGES))

# The build packages come first (order only), so that a fresh machine compiles the codec.
$(STAMP): pyproject.toml setup.py engine/_codec.c | build-tools
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

# The C and Node clients and their conformance drivers (tests/conformance), and the official
# RocketMQ 5 Node client of examples/rocketmq5 (tests/grpc). What cannot be built here is said and
# left out; its tests skip (or fail, under RMQ_TESTS_REQUIRE_ALL=1, as in CI).
clients: system-tools
	@if command -v cc >/dev/null && pkg-config --exists libzmq 2>/dev/null && [ -f /usr/include/msgpuck.h ]; then \
	  $(MAKE) -s -C clients/c; else echo "note: the C client is not built (cc, libzmq3-dev, libmsgpuck-dev needed)"; fi
	@if command -v npm >/dev/null; then \
	  (cd clients/node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) && \
	  (cd examples/rocketmq5 && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error); \
	else echo "note: the Node clients are not installed (node and npm, Node 18 or later, needed)"; fi

# Lint, types and the import rules of the package map are part of the tests: ruff's rules, mypy's
# settings and import-linter's contracts are in pyproject.toml. The one mypy run holds the store core
# to --strict's flags too (the per-module overrides there say which modules and why).
lint: $(TEST_STAMP)
	$(PY) -m ruff check engine supervisor rmqpy harness tests scripts
	$(PY) -m mypy engine supervisor rmqpy harness
	$(VENV)/bin/lint-imports

# The default run leaves out the long end-to-end runs (marked slow): test-slow runs just those,
# test-all runs everything.
test: $(TEST_STAMP) clients lint
	@$(PY) -c 'import engine.codec as c; c.COMPILED or print("note: engine/_codec.c is not compiled (gcc and zlib1g-dev needed); the Python codec runs, slower")'
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-slow: $(TEST_STAMP) clients
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

test-all: $(TEST_STAMP) clients lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) *.egg-info
