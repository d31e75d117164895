# Two commands do everything on a fresh Debian machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS := dev,fastapi,redis,memcached,policy,metrics,bench

.PHONY: setup demo bench test lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install-system-deps.sh
	bash scripts/install-system-deps.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

bench: setup
	$(VENV)/bin/ratewarden bench --quick

demo: setup
	$(VENV)/bin/ratewarden demo

lint: setup
	$(PY) -m ruff check src tests
	$(PY) -m mypy

test: setup lint
	$(PY) -m pytest

clean:
	rm -rf $(VENV) build dist src/*.egg-info
