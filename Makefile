# Two commands do everything on a fresh Debian machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS := dev,fastapi,redis,memcached,policy,metrics,bench
# The mypyc-compiled package tree (what a wheel installs), built outside src/: the editable .venv
# install stays pure Python, and a .so inside src/ would shadow the .py files being edited.
COMPILED := build/compiled
COMPILED_PATH := $(abspath $(COMPILED))
# Files and directories (a directory's time changes when a file in it is added or removed).
SOURCES := $(shell find src/ratewarden -name __pycache__ -prune -o -print)

.PHONY: setup compiled demo bench test test-pure test-compiled lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install-system-deps.sh
	bash scripts/install-system-deps.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

# Rebuilt when any source changes (about 7 s when only pure-Python modules changed, 25 s when a
# compiled one did); from scratch when the build set-up changed or a source file was removed.
compiled: $(COMPILED)/.built

$(COMPILED)/.built: $(VENV)/.installed setup.py pyproject.toml $(SOURCES)
	@if [ -e $@ ] && [ -n "$$(find $(VENV)/.installed setup.py pyproject.toml -newer $@; \
	    cd $(COMPILED) && find ratewarden -type f ! -name '*.so' ! -path '*/__pycache__/*' | \
	    while read -r f; do [ -e ../../src/$$f ] || echo $$f; done)" ]; then rm -rf $(COMPILED); fi
	@mkdir -p $(COMPILED) && touch $@.new  # sources edited during the build make the next run rebuild
	RATEWARDEN_REQUIRE_COMPILED=1 $(PY) setup.py -q build --build-base build/mypyc --build-lib $(COMPILED)
	mv $@.new $@

# Users install compiled wheels, so the benchmark runs the compiled tree.
bench: setup compiled
	PYTHONPATH=$(COMPILED_PATH) $(VENV)/bin/ratewarden bench --quick

demo: setup
	$(VENV)/bin/ratewarden demo

lint: setup
	$(PY) -m ruff check src tests
	$(PY) -m mypy

# The whole suite twice: the pure-Python package, then the compiled tree (subprocesses the tests
# start inherit PYTHONPATH, so they run the same build).
test: setup lint test-pure test-compiled

test-pure: setup
	RATEWARDEN_EXPECT_COMPILED=0 $(PY) -m pytest

test-compiled: setup compiled
	RATEWARDEN_EXPECT_COMPILED=1 PYTHONPATH=$(COMPILED_PATH) $(PY) -m pytest

clean:
	rm -rf $(VENV) build dist src/*.egg-info
