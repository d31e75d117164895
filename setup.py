"""Optional mypyc compilation of ratewarden's hot path (metadata lives in pyproject.toml).

A wheel or a regular install compiles the modules in ``HOT_MODULES`` with mypyc (shipped inside
mypy, a build requirement only: mypyc's runtime is embedded in the built extension, so the
package keeps no runtime dependency), and on Linux the shared-memory store's C helpers
(``NATIVE_EXTENSIONS``). The result stays pure Python when

* ``RATEWARDEN_PURE_PYTHON=1`` is set,
* the install is editable (``pip install -e``): compiled modules inside ``src/`` would shadow the
  ``.py`` files being edited,
* or compilation fails (mypyc or the C compiler, e.g. no ``cc`` or no Python headers): one line
  saying so goes to the build log (``pip install -v``, ``python -m build``) and the pure-Python
  package is built instead (``ratewarden --version`` then says "pure Python").
  ``RATEWARDEN_REQUIRE_COMPILED=1`` turns that fallback into an error.

``python -c "import ratewarden; print(ratewarden.COMPILED)"`` tells which one is installed.
"""

from __future__ import annotations

import inspect
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# The modules a request goes through (paths relative to this file). rates.py (parsing, at start-up
# only) stays interpreted: compiled, it would raise TypeError instead of ValueError for bad input.
HOT_MODULES = [
    "src/ratewarden/decision.py",
    "src/ratewarden/scopes.py",
    "src/ratewarden/context.py",
    "src/ratewarden/limits.py",
    "src/ratewarden/algorithms/__init__.py",
    "src/ratewarden/algorithms/base.py",
    "src/ratewarden/algorithms/fixed_window.py",
    "src/ratewarden/algorithms/gcra.py",
    "src/ratewarden/algorithms/leaky_bucket.py",
    "src/ratewarden/algorithms/sliding_log.py",
    "src/ratewarden/algorithms/sliding_window.py",
    "src/ratewarden/algorithms/token_bucket.py",
    "src/ratewarden/algorithms/token_bucket_debt.py",
    "src/ratewarden/stores/base.py",
    "src/ratewarden/stores/memory.py",
    "src/ratewarden/stores/shared_memory/__init__.py",
    "src/ratewarden/stores/shared_memory/errors.py",
    "src/ratewarden/stores/shared_memory/layout.py",
    "src/ratewarden/stores/shared_memory/mutex.py",
    "src/ratewarden/stores/shared_memory/segment.py",
    "src/ratewarden/stores/shared_memory/table.py",
    "src/ratewarden/stores/shared_memory/locks.py",
    "src/ratewarden/stores/shared_memory/slots.py",
    "src/ratewarden/stores/shared_memory/store.py",
    "src/ratewarden/stores/shared_memory/operations.py",
    "src/ratewarden/rules.py",
    "src/ratewarden/credentials.py",
    "src/ratewarden/keys.py",
    "src/ratewarden/headers.py",
    "src/ratewarden/enforcement.py",
    "src/ratewarden/responses.py",
    "src/ratewarden/limiter.py",
    "src/ratewarden/asgi/middleware.py",
    "src/ratewarden/asgi/websocket.py",
    "src/ratewarden/asgi/edge.py",
]

# Hand-written C built next to the mypyc modules (Linux only: process-shared robust mutexes). The
# package works without them (a pure-Python build takes the same mutexes through ctypes).
NATIVE_EXTENSIONS = [
    Extension(
        "ratewarden.stores.shared_memory._native",
        ["src/ratewarden/stores/shared_memory/_native.c"],
        extra_compile_args=["-O2"],
    ),
] if sys.platform.startswith("linux") else []

# How mypyc's type check runs in a build. The build needs the hot modules' types, not a lint pass
# (``make lint`` runs mypy --strict with every extra installed): pip's isolated build environment
# holds only setuptools and mypy, so the optional libraries (redis, aiomcache, prometheus_client,
# yaml...) are missing there. Their imports become ``Any`` and the modules that use them are
# followed silently: the hot modules, which never import an optional library, compile the same.
BUILD_TYPE_CHECK = ["--ignore-missing-imports", "--follow-imports=silent"]

# Commands that build the package (metadata-only commands such as egg_info/dist_info must not pay
# for a mypyc run); editable builds never compile.
_BUILD_COMMANDS = {"build", "build_ext", "bdist_wheel", "bdist", "install"}
_EDITABLE_COMMANDS = {"develop", "editable_wheel"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _fail_or_warn(message: str) -> None:
    message = " ".join(message.split())  # one line, whatever the compiler printed
    if _flag("RATEWARDEN_REQUIRE_COMPILED"):
        raise SystemExit(f"ratewarden: {message} (RATEWARDEN_REQUIRE_COMPILED is set)")
    print(f"ratewarden: {message}; building the pure-Python package instead "
          "(set RATEWARDEN_REQUIRE_COMPILED=1 to make this an error)", file=sys.stderr, flush=True)


def _toolchain_problem() -> str | None:
    """Why no extension can be built here (no Python headers, no working C compiler), or None.

    Checked before mypyc runs, so such a machine gets a pure-Python wheel tagged ``py3-none-any``.
    """
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python headers (Python.h is not in {include}; install python3-dev)"
    from distutils.ccompiler import new_compiler  # setuptools' own copy, also on Python 3.12+
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp, "probe.c")
        probe.write_text("#include <Python.h>\nint probe(void) { return 0; }\n")
        try:
            compiler.compile([str(probe)], output_dir=tmp, include_dirs=[include])
        except Exception as exc:
            return f"no working C compiler ({type(exc).__name__}: {exc})"
    return None


def _ext_modules() -> list[Any]:
    commands = set(sys.argv[1:])
    if _flag("RATEWARDEN_PURE_PYTHON") or commands & _EDITABLE_COMMANDS or not commands & _BUILD_COMMANDS:
        return []
    problem = _toolchain_problem()
    if problem:
        _fail_or_warn(f"cannot compile the hot path: {problem}")
        return []
    try:
        from mypyc.build import mypycify

        # RATEWARDEN_OPT_LEVEL: the C compiler's -O level (3 unless set), to compare builds.
        options: dict[str, Any] = {"opt_level": os.environ.get("RATEWARDEN_OPT_LEVEL", "3"), "debug_level": "0"}
        if "group_name" in inspect.signature(mypycify).parameters:  # newer mypyc (older: a hashed name)
            options["group_name"] = "ratewarden"  # the shared library: ratewarden__mypyc.*.so
        return [*mypycify([*BUILD_TYPE_CHECK, *HOT_MODULES], **options), *NATIVE_EXTENSIONS]
    except (Exception, SystemExit) as exc:  # mypyc exits on type errors
        _fail_or_warn(f"mypyc could not compile the hot-path modules ({type(exc).__name__}: {exc})")
        return []


class OptionalBuildExt(build_ext):
    """``build_ext`` that falls back to pure Python when the C compiler fails: every extension or
    none (a half-built set would import a shim without its shared library)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            for output in self.get_outputs():
                Path(output).unlink(missing_ok=True)
            if self.build_temp:
                shutil.rmtree(self.build_temp, ignore_errors=True)
            _fail_or_warn(f"compiling the mypyc extensions failed ({type(exc).__name__}: {exc})")


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
