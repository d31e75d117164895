"""The mypyc-compiled hot path (setup.py): the tested build is the expected one, and compiled
classes behave like the pure-Python ones where users can tell.

``make test`` runs the suite on the editable pure-Python package (``RATEWARDEN_EXPECT_COMPILED=0``)
and on the compiled wheel installed in a fresh virtualenv, for the oldest and the newest Python
found (``scripts/test-wheel.sh``: ``RATEWARDEN_EXPECT_COMPILED=1``, ``RATEWARDEN_EXPECT_INSTALLED=1``).
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import ratewarden
from ratewarden import _mypyc
from ratewarden.cli import version_text
from ratewarden.decision import Decision
from ratewarden.limits import Limit
from ratewarden.stores.adapted import as_store
from ratewarden.stores.base import Store
from ratewarden.stores.memory import MemoryStore

ROOT = Path(__file__).resolve().parent.parent
EXPECT = os.environ.get("RATEWARDEN_EXPECT_COMPILED")


def hot_modules() -> list[str]:
    """The module names setup.py compiles (its ``HOT_MODULES`` list of paths)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HOT_MODULES" for t in node.targets):
            paths: list[str] = ast.literal_eval(node.value)
            return [p.removeprefix("src/").removesuffix(".py").replace("/", ".").removesuffix(".__init__") for p in paths]
    raise AssertionError("setup.py has no HOT_MODULES list")


@pytest.mark.skipif(EXPECT is None, reason="RATEWARDEN_EXPECT_COMPILED not set (make test sets it)")
def test_the_tested_build_is_the_expected_one() -> None:
    expected = EXPECT == "1"
    memory_file = importlib.import_module("ratewarden.stores.memory").__file__ or ""
    assert memory_file.endswith(".so") is expected, memory_file
    assert ratewarden.COMPILED is expected
    for name in hot_modules():
        module = importlib.import_module(name)
        assert _mypyc.is_compiled(module) is expected, f"{name}: {module.__file__}"
    # rates.py raises ValueError for non-str input; compiled it would raise TypeError.
    assert not _mypyc.is_compiled(importlib.import_module("ratewarden.rates"))
    if expected:
        assert "/src/ratewarden/" not in memory_file  # the compiled tree, never .so files inside src/


def test_no_compiled_module_inside_src() -> None:
    """Editable installs stay pure Python: an extension module in src/ would shadow its .py file. The
    one exception is the compiled front door, ``ratewarden._front`` (setup.py builds it in place), which
    has no .py file to shadow."""
    package = ROOT / "src" / "ratewarden"
    stray = [p for p in (ROOT / "src").rglob("*")
             if p.suffix in (".so", ".pyd") and not (p.parent == package and p.name.split(".")[0] == "_front")]
    assert stray == []
    assert not (package / "_front.py").exists()


def test_every_compiled_class_accepts_interpreted_subclasses() -> None:
    """Users (and tests, and ratewarden.policy) subclass these; mypyc refuses unless the class is
    decorated with ``@mypyc_attr(allow_interpreted_subclasses=True)``."""
    for name in hot_modules():
        module = importlib.import_module(name)
        for obj in list(vars(module).values()):
            if isinstance(obj, type) and obj.__module__ == name and not getattr(obj, "_is_protocol", False):
                type(f"Sub{obj.__name__}", (obj,), {})  # raises TypeError when not allowed


def test_runtime_needs_no_mypy_extensions() -> None:
    code = "import sys, ratewarden, ratewarden.asgi.middleware; print(sorted(m for m in sys.modules if m.startswith('mypy')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_version_says_which_build() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ratewarden.cli", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == version_text()
    assert ("mypyc-compiled" if ratewarden.COMPILED else "pure Python") in out


class _Remote:
    local = False

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        raise NotImplementedError

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        raise NotImplementedError

    async def reset(self, keys: Sequence[str]) -> None:
        raise NotImplementedError


def test_store_isinstance_checks_stay_apart() -> None:
    """Compiled ABCs once shared one ABC cache: after ``isinstance(remote, Store)``,
    ``isinstance(remote, MemoryStore)`` was True too."""
    remote = as_store(_Remote())  # an interpreted subclass of the compiled Store
    assert isinstance(remote, Store)
    assert not isinstance(remote, MemoryStore)
    assert isinstance(MemoryStore(), Store)
    assert not issubclass(_Remote, MemoryStore)


def test_interpreted_subclass_overrides_local() -> None:
    class RemoteMemory(MemoryStore):
        local = False

    assert RemoteMemory().local is False
    assert MemoryStore().local is True
