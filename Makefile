# Two entry points: `make start` runs the engine, `make test` runs the tests.
# Both create ./.venv and install what they need on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: start test test-slow test-all lint setup build-tools system-tools clients clean

# Debian packages, installed when we are root and they are missing, one apt-get call per group so that
# a group apt refuses does not keep the others out. A package is written PACKAGE=PROOF and asked for
# only when its proof is missing: a command on PATH, or a file when it starts with /. The build group
# comes before the install below (gcc and zlib's headers compile engine/_codec.c, the hot loops;
# without them the engine runs on the Python codec, slower). The others: libzmq and msgpuck for the C
# client, node and npm for the Node clients, strace for the fsync-failure tests, Chromium and
# ChromeDriver for the dashboard's browser test, bindfs and fuse3 for a store on a FUSE mount,
# etcd-server for the failover tests (a broker set elected on etcd), prometheus (with promtool) for
# the alerting rules' tests (its own service is masked first, so that no Prometheus of the package
# holds port 9090: the tests start their own), iproute2, nftables and faketime for the test bed of
# hosts in network namespaces (harness/testbed). npm has its own call, made only
# if no npm command exists once nodejs is in: NodeSource's nodejs bundles npm and conflicts with
# Debian's npm, so asking for both refuses both. Without root, what is missing is named and what
# needs it is skipped.
# Where the headers that prove a -dev package are looked for (tests/integration/test_make_setup.py
# points it at an empty folder to play a fresh machine).
INCLUDE_DIR ?= /usr/include
BUILD_PACKAGES := gcc=cc libc6-dev=$(INCLUDE_DIR)/stdio.h zlib1g-dev=$(INCLUDE_DIR)/zlib.h
C_CLIENT_PACKAGES := make=make pkg-config=pkg-config libzmq3-dev=$(INCLUDE_DIR)/zmq.h \
	libmsgpuck-dev=$(INCLUDE_DIR)/msgpuck.h
BROWSER_PACKAGES := chromium=chromium chromium-driver=chromedriver
FUSE_PACKAGES := bindfs=bindfs fuse3=fusermount3
TESTBED_PACKAGES := iproute2=ip nftables=nft faketime=faketime
TEST_PACKAGES := $(BUILD_PACKAGES) $(C_CLIENT_PACKAGES) nodejs=node npm=npm strace=strace $(BROWSER_PACKAGES) \
	$(FUSE_PACKAGES) etcd-server=etcd prometheus=promtool $(TESTBED_PACKAGES)
found = $(if $(filter /%,$(1)),$(wildcard $(1)),$(shell command -v $(1) 2>/dev/null))
missing = $(strip $(foreach p,$(1),$(if $(call found,$(lastword $(subst =, ,$(p)))),,$(firstword $(subst =, ,$(p))))))
APT := $(if $(filter 0,$(shell id -u)),$(shell command -v apt-get 2>/dev/null))
# $(call apt_update,PACKAGES): once per target, before its groups, when one of them will be installed.
apt_update = $(if $(APT),$(if $(call missing,$(1)),apt-get update -qq || echo "note: apt-get update failed"))
# $(call install_group,PACKAGES,what is skipped without them[,a shell test that must still hold, or a step first]).
install_group = $(if $(call missing,$(1)),$(if $(APT),$(3){ echo "installing Debian packages: $(call missing,$(1))" \
	&& DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(call missing,$(1)) >/dev/null \
	|| echo "note: apt-get could not install $(call missing,$(1)); $(2)"; },echo "note: missing \
	$(call missing,$(1)) (as root: apt-get install $(call missing,$(1))); $(2)"))
build-tools:
	@$(call apt_update,$(BUILD_PACKAGES))
	@$(call install_group,$(BUILD_PACKAGES),engine/_codec.c is not compiled and the Python codec runs)
system-tools:
	@$(call apt_update,$(TEST_PACKAGES))
	@$(call install_group,$(BUILD_PACKAGES),engine/_codec.c is not compiled and the Python codec runs)
	@$(call install_group,$(C_CLIENT_PACKAGES),the C client is not built)
	@$(call install_group,nodejs=node,the Node clients are not installed)
	@$(call install_group,npm=npm,the Node clients are not installed,command -v npm >/dev/null || )
	@$(call install_group,strace=strace,the fsync-failure tests skip)
	@$(call install_group,$(BROWSER_PACKAGES),the dashboard's browser test skips)
	@$(call install_group,$(FUSE_PACKAGES),the tests of a store on a FUSE mount skip)
	@$(call install_group,etcd-server=etcd,the failover tests skip)
	@$(call install_group,prometheus=promtool,the Prometheus tests skip,systemctl mask -q prometheus 2>/dev/null; )
	@$(call install_group,$(TESTBED_PACKAGES),the tests on hosts in network namespaces skip)

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
