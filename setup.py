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

``ratewarden._front``, the compiled front door of ``ratewarden serve`` (``rust/``), is built by cargo
through setuptools-rust, editable installs included, when cargo is on PATH (Rust from rustup). Without
cargo, or when cargo fails, the package is complete without it (``ratewarden serve`` uses its Python
front door) and the build says why; ``RATEWARDEN_REQUIRE_FRONT=1`` makes that an error, and
``RATEWARDEN_NO_FRONT=1`` leaves it out on purpose (``make bench``'s wheel: no gateway in its scenarios). The package's
``_front_build.txt`` records the outcome: ``compiled``, or why not.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
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
    "src/ratewarden/caches.py",
    "src/ratewarden/storage_keys.py",
    "src/ratewarden/paths.py",
    "src/ratewarden/rule_index.py",
    "src/ratewarden/rules.py",
    "src/ratewarden/credentials.py",
    "src/ratewarden/keys.py",
    "src/ratewarden/headers.py",
    "src/ratewarden/enforcement/core.py",
    "src/ratewarden/enforcement/check.py",
    "src/ratewarden/enforcement/answers.py",
    "src/ratewarden/enforcement/outcome.py",
    "src/ratewarden/enforcement/charge_strategies.py",
    "src/ratewarden/asgi/responses.py",
    "src/ratewarden/store_health.py",
    "src/ratewarden/limiter.py",
    "src/ratewarden/asgi/middleware.py",
    "src/ratewarden/asgi/websocket.py",
    "src/ratewarden/fastapi/edge.py",
    "src/ratewarden/enforcement/sync_check.py",
    "src/ratewarden/wsgi/scope.py",
    "src/ratewarden/wsgi/middleware.py",
    "src/ratewarden/serve/spop.py",
    "src/ratewarden/serve/spoe.py",
    "src/ratewarden/serve/rls_messages.py",
    "src/ratewarden/serve/descriptors.py",
    "src/ratewarden/serve/rls_headers.py",
    "src/ratewarden/serve/rls.py",
    "src/ratewarden/stores/redis/batching.py",
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
        compiled = mypycify([*BUILD_TYPE_CHECK, *HOT_MODULES], **options)
    except (Exception, SystemExit) as exc:  # mypyc exits on type errors
        _fail_or_warn(f"mypyc could not compile the hot-path modules ({type(exc).__name__}: {exc})")
        return []
    try:
        _document_generated_c(compiled)
    except Exception as exc:  # the build still works, without run-time documentation
        print(f"ratewarden: could not write the docstrings into mypyc's C ({type(exc).__name__}: {exc}); "
              "the compiled package has no __doc__", file=sys.stderr, flush=True)
    return [*compiled, *NATIVE_EXTENSIONS]


# The compiled front door. The crate is built for the stable ABI (pyo3's abi3-py310), so one cargo build
# serves every Python version: builds share CARGO_TARGET_DIR (build/cargo beside this file unless set;
# the release build from the sdist sets it to the clone's), and only the first one compiles. pyo3 needs
# no interpreter for a Unix abi3 module (PYO3_NO_PYTHON): otherwise each interpreter's path, which
# setuptools-rust passes as PYO3_PYTHON, would make cargo rebuild pyo3 and the crate.
FRONT = "ratewarden._front"
FRONT_RECORD = "_front_build.txt"
RUSTUP = "https://rustup.rs"


def _front_skipped(why: str) -> None:
    print(f"ratewarden: the compiled front door ({FRONT}) is not built: {why}; `ratewarden serve` "
          "uses its Python front door", file=sys.stderr, flush=True)


def _rust_extensions() -> list[Any]:
    commands = set(sys.argv[1:])
    if _flag("RATEWARDEN_PURE_PYTHON") or not commands & (_BUILD_COMMANDS | _EDITABLE_COMMANDS):
        return []
    if sys.platform == "win32":
        _front_skipped("it serves through Unix sockets, and this is Windows")
        return []
    problem = _toolchain_problem()  # cargo links with the C toolchain
    if problem:
        _front_skipped(problem)
        return []
    try:
        from setuptools_rust import Binding, RustExtension
    except ImportError:  # a --no-build-isolation build in an environment without it
        _front_skipped("setuptools-rust is not installed in the build environment")
        return []
    os.environ.setdefault("CARGO_TARGET_DIR", str(Path(__file__).resolve().parent / "build" / "cargo"))
    os.environ.setdefault("PYO3_NO_PYTHON", "1")
    # debug=False: an editable install builds the same release artifact as a wheel, from the same cache.
    return [RustExtension(FRONT, path="rust/Cargo.toml", binding=Binding.PyO3, debug=False,
                          optional=not _flag("RATEWARDEN_REQUIRE_FRONT"))]


def _build_front_command() -> dict[str, Any]:
    try:
        from setuptools_rust.build import build_rust
    except ImportError:
        return {}

    class BuildFront(build_rust):  # type: ignore[misc]
        """``build_rust`` that says why the front door is missing and records the outcome in the package."""

        outcome = "cargo did not run"

        def run(self) -> None:
            if _flag("RATEWARDEN_NO_FRONT"):
                self.outcome = "not asked for (RATEWARDEN_NO_FRONT is set: `make bench` runs no gateway)"
            elif shutil.which("cargo") is None:
                self.outcome = f"no cargo on PATH when ratewarden was built (Rust comes from rustup: {RUSTUP})"
                if _flag("RATEWARDEN_REQUIRE_FRONT"):
                    raise SystemExit(f"ratewarden: {self.outcome} (RATEWARDEN_REQUIRE_FRONT is set)")
            else:
                super().run()
            if self.outcome != "compiled":
                _front_skipped(self.outcome)
            for ext in self.extensions:
                built = Path(self.get_dylib_ext_path(ext, ext.name))
                if self.outcome != "compiled":  # one left by an earlier build (build/lib, or in place)
                    built.unlink(missing_ok=True)
                built.parent.mkdir(parents=True, exist_ok=True)
                (built.parent / FRONT_RECORD).write_text(self.outcome + "\n", encoding="utf-8")

        def run_for_extension(self, ext: Any) -> None:
            try:
                super().run_for_extension(ext)
            except Exception as exc:
                self.outcome = "cargo failed: " + " ".join(f"{type(exc).__name__}: {exc}".split())[-500:]
                raise
            self.outcome = "compiled"

    return {"build_rust": BuildFront}


# Documentation in the compiled package. mypyc drops docstrings: a compiled function is a builtin whose
# __doc__ and __text_signature__ come from its PyMethodDef's ml_doc, a compiled class takes both from its
# type's tp_doc, and mypyc writes there at most a text signature ("name(a, b=1)\n--\n\n", and none when a
# default is not a literal). _document_generated_c rewrites those strings in the C that mypycify wrote
# (before build_ext compiles it) to what the pure-Python package has: the text signature from the source
# (parameters and literal defaults: a text signature has no annotations) followed by the docstring, as
# the building interpreter's compiler stores it (Python 3.13 strips the indentation). A class's exact
# signature (annotations, defaults such as ``key=CLIENT_IP``) comes at run time from
# ratewarden._mypyc.attach_signatures.

_C_STRING = r'"(?:[^"\\\n]|\\.)*"(?:\s*"(?:[^"\\\n]|\\.)*")*'
_C_DOC = rf"PyDoc_STR\((?:NULL|{_C_STRING})\)|NULL"
# A PyMethodDef (module function, method) or a CPyFunction_New call (async def): the C function, its
# flags, then the doc.
_C_FUNCTION = re.compile(rf"(\(PyCFunction\)CPyPy_(\w+),\s*[A-Z_][A-Z_ |]*,\s*)({_C_DOC})")
_C_TYPE = re.compile(r"(static PyTypeObject CPyType_(\w+)_template_ = \{)(.*?)(\n[ \t]*\};)", re.S)
_C_TP_DOC = re.compile(rf"\.tp_doc = (?:{_C_DOC}),")
# An async def: mypyc makes a "Function compiled with mypyc" object, which shows no ml_doc; from Python
# 3.12 it has a __dict__ to hold its __doc__ (set right after the object is made).
_C_COROUTINE = re.compile(r"(PyObject\* (wrapper_CPyPy_(\w+)) = CPyFunction_New\(.*?\);\s*"
                          r"if \(unlikely\(!\2\)\)\s*(?:goto fail|return \w+);)(?!\n#if PY_VERSION_HEX)", re.S)
_C_PROPERTY = re.compile(r'(\{"(\w+)",\s*\(getter\)(\w+)_get_\2,\s*(?:\(setter\)\w+|NULL),\s*)(NULL)')


def _c_string(text: str) -> str:
    """A C string literal of ``text`` (UTF-8, as CPython decodes ml_doc and tp_doc), in short pieces."""
    chars = [chr(b) if 0x20 <= b < 0x7F and b not in b'"\\?' else f"\\{b:03o}" for b in text.encode()]
    return "\n".join('"' + "".join(chars[i:i + 60]) + '"' for i in range(0, len(chars), 60)) or '""'


def _docstring(node: ast.AST) -> str | None:
    """``node``'s ``__doc__`` in the pure-Python package on this interpreter."""
    raw = ast.get_docstring(node, clean=False)  # type: ignore[arg-type]
    if raw is None:
        return None
    namespace: dict[str, Any] = {}
    exec(compile(f"def f():\n    {raw!r}\n", "<docstring>", "exec"), namespace)  # the compiler's cleaning
    doc: str = namespace["f"].__doc__
    return doc


class _Expression:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _text_signature(node: ast.FunctionDef | ast.AsyncFunctionDef, first: str, module: str) -> str | None:
    """``(a, b=1)`` for ``node``'s parameters (``first``: ``"$"`` marks the bound first parameter,
    ``"drop"`` leaves it out, ``""`` keeps it), or None when a default is neither a literal nor a
    name. A name is written qualified by ``module`` (``algorithm=ratewarden.limiter.DEFAULT_ALGORITHM``):
    inspect evaluates it, in the module of a function but in ``sys.modules`` for a method (a method
    has no ``__module__``), so only a qualified name resolves in both; a name whose value is not a
    constant (``fallback=client_ip``) gives no valid text signature, and such a function gets a Python
    wrapper at run time (``ratewarden._mypyc.attach_signatures``)."""
    args = node.args
    kinds = inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + [*args.defaults]
    spec = [(a, kinds.POSITIONAL_ONLY if i < len(args.posonlyargs) else kinds.POSITIONAL_OR_KEYWORD, d)
            for i, (a, d) in enumerate(zip(positional, defaults, strict=True))]
    if args.vararg:
        spec.append((args.vararg, kinds.VAR_POSITIONAL, None))
    spec += [(a, kinds.KEYWORD_ONLY, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg:
        spec.append((args.kwarg, kinds.VAR_KEYWORD, None))
    bound = ""
    if first and spec:
        bound = spec.pop(0)[0].arg
    params = []
    for arg, kind, default in spec:
        value: Any = inspect.Parameter.empty
        if isinstance(default, (ast.Name, ast.Attribute)):  # inspect reads a constant's value in the module
            value = _Expression(f"{module}.{ast.unparse(default)}")
        elif default is not None:
            try:
                value = ast.literal_eval(default)
                if ast.literal_eval(repr(value)) != value:
                    return None
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
        params.append(inspect.Parameter(arg.arg, kind, default=value))
    text = str(inspect.Signature(params))
    if first == "$" and bound:
        text = f"(${bound}" + (", " + text[1:] if text != "()" else ")")
    return text


def _c_doc(name: str, signature: str | None, doc: str | None) -> str:
    text = (f"{name}{signature}\n--\n\n" if signature is not None else "") + (doc or "")
    return f"PyDoc_STR({_c_string(text)})" if text else "NULL"


def _document_generated_c(extensions: list[Any]) -> None:
    from mypyc.namegen import NameGenerator

    modules = {path.removeprefix("src/").removesuffix(".py").replace("/", ".").removesuffix(".__init__"): path
               for path in HOT_MODULES}
    names = NameGenerator([list(modules)])
    functions: dict[str, str] = {}  # C name -> the C doc initializer
    docs: dict[str, str] = {}  # C name -> the docstring
    types: dict[str, str] = {}
    properties: dict[tuple[str, str], str] = {}
    here = Path(__file__).resolve().parent
    for module, path in modules.items():
        tree = ast.parse((here / path).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.setdefault(names.private_name(module, node.name),
                                     _c_doc(node.name, _text_signature(node, "", module), _docstring(node)))
                docs.setdefault(names.private_name(module, node.name), _docstring(node) or "")
            elif isinstance(node, ast.ClassDef):
                cls = names.private_name(module, node.name)
                init = None
                for member in node.body:
                    if not isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    decorators = {ast.unparse(d) for d in member.decorator_list}
                    if "property" in decorators:
                        doc = _docstring(member)
                        if doc:
                            properties.setdefault((cls, member.name), f"PyDoc_STR({_c_string(doc)})")
                        continue
                    if any(d.endswith((".setter", ".deleter")) for d in decorators):
                        continue
                    if member.name == "__init__":
                        init = member
                    first = "" if "staticmethod" in decorators else "$"
                    functions.setdefault(names.private_name(module, f"{node.name}.{member.name}"),
                                         _c_doc(member.name, _text_signature(member, first, module), _docstring(member)))
                    docs.setdefault(names.private_name(module, f"{node.name}.{member.name}"), _docstring(member) or "")
                signature = _text_signature(init, "drop", module) if init is not None else None
                types[cls] = _c_doc(node.name, signature, _docstring(node))

    done: set[str] = set()

    def function(match: re.Match[str]) -> str:
        doc = functions.get(match[2])
        if doc is None:
            return match[0]
        done.add(match[2])
        return match[1] + doc

    def type_(match: re.Match[str]) -> str:
        doc = types.get(match[2])
        if doc is None:
            return match[0]
        done.add(match[2])
        body, found = _C_TP_DOC.subn(lambda _: f".tp_doc = {doc},", match[3])
        if not found:
            body = f"\n.tp_doc = {doc},{body}"
        return match[1] + body + match[4]

    def coroutine(match: re.Match[str]) -> str:
        doc = docs.get(match[3])
        if not doc:
            return match[0]
        return (f"{match[1]}\n#if PY_VERSION_HEX >= 0x030C0000\n"
                f"{{ PyObject *doc = PyUnicode_FromString({_c_string(doc)});\n"
                f"if (doc == NULL || PyObject_SetAttrString({match[2]}, \"__doc__\", doc) < 0) PyErr_Clear();\n"
                "Py_XDECREF(doc); }\n#endif\n")

    def property_(match: re.Match[str]) -> str:
        doc = properties.get((match[3], match[2]))
        return match[0] if doc is None else match[1] + doc

    sources = {source for ext in extensions for source in ext.sources if source.endswith(".c")}
    for source in sorted(sources):
        text = Path(source).read_text(encoding="utf-8")
        patched = _C_COROUTINE.sub(coroutine, text)  # before the docs below make its argument longer
        patched = _C_PROPERTY.sub(property_, _C_TYPE.sub(type_, _C_FUNCTION.sub(function, patched)))
        if patched != text:
            Path(source).write_text(patched, encoding="utf-8")
    print(f"ratewarden: docstrings written into {len(done)} compiled classes and functions "
          f"(of {len(functions) + len(types)} in the source)", file=sys.stderr, flush=True)


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


_rust = _rust_extensions()
setup(ext_modules=_ext_modules(), **({"rust_extensions": _rust} if _rust else {}),
      cmdclass={"build_ext": OptionalBuildExt, **_build_front_command()})
