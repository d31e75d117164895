"""Conventions of issue 22, checked on the source (``src/ratewarden``):

1. One import guard per optional library: the ``try: import <lib> ... except ImportError: raise
   ImportError("... pip install 'ratewarden[<extra>]'")`` that names the extra to install is
   written once per library; redis-py is imported only by ``stores/redis/_redis.py``.
2. Every deliberate start-up (configuration) error is a ``ConfigurationError``: ``raise
   ValueError`` is left only where the value comes with each call (``ALLOWED_VALUE_ERRORS``).

``ratewarden/bench`` (the benchmark harness) is left out: the libraries it imports are the
benchmarks' own tools (a sync redis client to start servers, other rate limiters), not the
package's extras, and its ``ValueError``s are about measurements, not configuration.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "ratewarden"
EXCLUDED = ("bench/",)

#: The optional libraries the package imports (its extras, and tomli on Python 3.10).
OPTIONAL = ("redis", "aiomcache", "pymemcache", "yaml", "tomli", "prometheus_client", "opentelemetry",
            "fastapi", "starlette", "uvicorn")

#: ``raise ValueError`` left on purpose, as (module, function): values that come with each call,
#: not configuration given at start-up.
ALLOWED_VALUE_ERRORS = {
    # A request's cost given to ``Limiter.hit`` / ``hit_sync`` (often computed from the request);
    # its twin for a non-number is a ``TypeError``.
    ("limiter.py", "_check_cost"),
    # ``Store.adjust`` given keys, limits and amounts of different lengths: a broken call of the
    # store API (the limiter and ``charges.adjust`` build them together), not a setting.
    ("stores/redis/store.py", "adjust"),
    ("stores/memcached/store.py", "adjust"),
    ("stores/shared_memory/store.py", "adjust_now"),
    # A negative integer given to the SPOP encoder (HAProxy's varints are unsigned): a broken call
    # of the codec with a value of each frame, not a setting.
    ("serve/spop.py", "encode_varint"),
    ("serve/spop.py", "_encode_typed"),
}

REDIS_MISSING = "RedisStore needs the redis client: pip install 'ratewarden[redis]'"


def _modules() -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith(EXCLUDED):
            found.append((rel, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))))
    return found


def _imported(node: ast.AST) -> list[str]:
    """The top-level names of the modules ``node`` imports (``redis`` for ``from redis.crc import ...``)."""
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module.split(".")[0]]
    return []


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in ("ImportError", "ModuleNotFoundError") for k in kinds)


def _raises_import_error(handler: ast.ExceptHandler) -> bool:
    for node in ast.walk(handler):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            if isinstance(func, ast.Name) and func.id == "ImportError":
                return True
    return False


def _guards() -> dict[str, list[str]]:
    """Library -> the modules holding a guard of its import (an ``except ImportError`` raising a
    new ``ImportError``)."""
    guards: dict[str, list[str]] = {}
    for rel, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Try):
                continue
            if not any(_catches_import_error(h) and _raises_import_error(h) for h in node.handlers):
                continue
            libraries = {name for statement in node.body for child in ast.walk(statement) for name in _imported(child)}
            for library in sorted(libraries & set(OPTIONAL)):
                guards.setdefault(library, []).append(rel)
    return guards


def test_each_optional_library_has_one_import_guard() -> None:
    guards = _guards()
    repeated = {library: where for library, where in guards.items() if len(where) > 1}
    assert not repeated, f"one import guard per optional library, found several: {repeated}"
    assert guards["redis"] == ["stores/redis/_redis.py"]
    assert guards["aiomcache"] == ["stores/memcached/_aiomcache.py"]


def test_redis_py_is_imported_by_its_guard_module_only() -> None:
    importers = sorted({rel for rel, tree in _modules() for node in ast.walk(tree) if "redis" in _imported(node)})
    assert importers == ["stores/redis/_redis.py"]
    texts = {rel: (SRC / rel).read_text(encoding="utf-8") for rel, _ in _modules()}
    assert [rel for rel, text in texts.items() if REDIS_MISSING in text] == ["stores/redis/_redis.py"]


def test_without_redis_py_every_way_in_names_the_extra() -> None:
    """Each module that used to hold its own guard, the package, ``open_store`` and the lazy
    ``ratewarden.stores.RedisStore`` all fail with the one message."""
    code = (
        "import importlib, sys\n"
        "sys.modules['redis'] = None  # as if redis-py were not installed\n"
        "import ratewarden.stores\n"
        "ways = [lambda name=name: importlib.import_module(name) for name in (\n"
        "    'ratewarden.stores.redis', 'ratewarden.stores.redis.clock', 'ratewarden.stores.redis.errors',\n"
        "    'ratewarden.stores.redis.client', 'ratewarden.stores.redis.connections',\n"
        "    'ratewarden.stores.redis.topology')]\n"
        "ways.append(lambda: ratewarden.stores.open_store('redis://localhost:6379'))\n"
        "ways.append(lambda: ratewarden.stores.RedisStore)\n"
        "for way in ways:\n"
        "    for name in [m for m in sys.modules if m.startswith('ratewarden.stores.redis')]:\n"
        "        del sys.modules[name]\n"
        "    try:\n"
        "        way()\n"
        "    except ImportError as exc:\n"
        "        print(exc)\n"
        "    else:\n"
        "        raise SystemExit('imported without redis-py')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [REDIS_MISSING] * 8


def _value_error_raises() -> list[tuple[str, str, int]]:
    """``(module, enclosing function, line)`` of every ``raise ValueError``."""
    found: list[tuple[str, str, int]] = []

    def visit(rel: str, node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id == "ValueError":
                    found.append((rel, function, child.lineno))
            visit(rel, child, inner)

    for rel, tree in _modules():
        visit(rel, tree, "<module>")
    return found


def test_start_up_errors_are_configuration_errors() -> None:
    """``raise ValueError`` only where ``ALLOWED_VALUE_ERRORS`` says why; a new start-up check
    raises ``ConfigurationError`` (``ratewarden.errors``), itself a ``ValueError``."""
    stray = [f"{rel}:{line} (in {function})" for rel, function, line in _value_error_raises()
             if (rel, function) not in ALLOWED_VALUE_ERRORS]
    assert not stray, "raise ConfigurationError for a bad start-up value, not ValueError: " + ", ".join(stray)


def test_the_allow_list_is_not_stale() -> None:
    present = {(rel, function) for rel, function, _ in _value_error_raises()}
    assert ALLOWED_VALUE_ERRORS - present <= {("stores/shared_memory/store.py", "adjust_now")}, ALLOWED_VALUE_ERRORS - present
