"""Support for the optional mypyc-compiled hot path (see ``setup.py``). This module is never compiled.

Documentation: the build writes every compiled function's, method's and class's docstring and text
signature into the C mypyc generates (``setup.py``); a text signature has no annotations and only
literal defaults, so ``attach_signatures`` gives each compiled class a ``__signature__`` that is the
pure package's ``inspect.signature(cls)``, read from the ``.py`` source the wheel ships.

``mypyc_attr``: mypy and mypyc see ``mypy_extensions.mypyc_attr`` (so ``allow_interpreted_subclasses``
is honoured when the hot-path modules are compiled); at run time it is a no-op decorator, so
``mypy_extensions`` is never imported and the package keeps no runtime dependency.
"""

from __future__ import annotations

import abc
import ast
import contextlib
import copy
import inspect
import re
import sys
import textwrap
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import BuiltinFunctionType, CodeType, FunctionType, MethodDescriptorType, ModuleType
from typing import TYPE_CHECKING, Any

__all__ = ["attach_signatures", "is_compiled", "mypyc_attr", "repair_compiled_abcs"]

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:

    def mypyc_attr(*attrs: str, **kwattrs: Any) -> Any:
        return lambda cls: cls


def is_compiled(module: ModuleType) -> bool:
    """True when ``module`` was loaded from an extension module (built by mypyc)."""
    return (getattr(module, "__file__", None) or "").endswith(tuple(EXTENSION_SUFFIXES))


def repair_compiled_abcs(package: str = "ratewarden") -> None:
    """Give every compiled ``abc.ABC`` subclass its own ABC registry.

    mypyc builds native classes without running ``ABCMeta.__new__``, so a compiled ``Store`` and
    ``MemoryStore`` share ``abc.ABC``'s ``_abc_impl``: one subclass cache for every ABC, so that after
    ``isinstance(redis_store, Store)`` even ``isinstance(redis_store, MemoryStore)`` says True.
    """
    prefix = package + "."
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix) or not is_compiled(module):
            continue
        for obj in list(vars(module).values()):
            if isinstance(obj, abc.ABCMeta) and obj.__module__ == name and "_abc_impl" not in obj.__dict__:
                abc._abc_init(obj)  # type: ignore[attr-defined]
    attach_signatures(package)


def attach_signatures(package: str = "ratewarden") -> None:
    """Give every class of the compiled modules loaded so far the pure package's signature.

    A compiled class's ``__text_signature__`` (from the build) cannot hold annotations or a default
    such as ``key=CLIENT_IP``; ``inspect.signature`` reads ``__signature__`` first. The signature is
    computed on first use (nothing at import, nothing on the request path), and it follows
    subclasses the way ``inspect`` does: an interpreted subclass without its own ``__init__`` has
    its compiled base's signature, one with an ``__init__`` its own.

    What no ``__signature__`` can document gets a Python wrapper with the source's signature and
    docstring (``_python_wrapper``): a compiled function whose default is not a constant
    (``header(name, *, fallback=client_ip)``: a builtin has no ``__dict__`` and its text signature
    holds constants only), and before Python 3.12, where a compiled ``async def`` has no ``__dict__``
    either, the ``Limiter`` coroutines applications call (``_PYTHON_COROUTINES``).
    """
    prefix = package + "."
    replaced: dict[int, tuple[object, object]] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix) or not is_compiled(module):
            continue
        for attr, obj in list(vars(module).items()):
            if isinstance(obj, type) and obj.__module__ == name and "__signature__" not in obj.__dict__:
                with contextlib.suppress(TypeError, AttributeError):  # an immutable type: its text signature
                    obj.__signature__ = _COMPILED_SIGNATURE  # type: ignore[attr-defined]
                for member_name, member in list(vars(obj).items()):
                    _sign_coroutine(member, module)
                    if _needs_wrapper(member, f"{name}.{obj.__qualname__}", member_name):
                        wrapper = _python_wrapper(member, module, obj)
                        if wrapper is not None:
                            with contextlib.suppress(TypeError, AttributeError):
                                setattr(obj, member_name, wrapper)
            elif getattr(obj, "__module__", None) == name and _needs_wrapper(obj, name, attr):
                wrapper = _python_wrapper(obj, module, None)
                if wrapper is not None:
                    replaced[id(obj)] = (obj, wrapper)
            else:
                _sign_coroutine(obj, module)
    if replaced:  # every module that imported the compiled function sees the wrapper
        for name, module in list(sys.modules.items()):
            # ``None``: an import blocked on purpose (``sys.modules[name] = None``), no module to patch.
            if module is not None and (name == package or name.startswith(prefix)):
                for attr, obj in list(vars(module).items()):
                    found = replaced.get(id(obj))
                    if found is not None and found[0] is obj:
                        setattr(module, attr, found[1])


_PYTHON_COROUTINES = {"ratewarden.limiter.Limiter": frozenset({"hit", "peek", "reset", "clear", "close", "check_store"})}
"""Before Python 3.12, these compiled coroutines are wrapped (``_python_wrapper``) to show their signature
and docstring: the main API, called by applications rather than on the request path."""
_NAME_DEFAULT = re.compile(r"=\s*[A-Za-z_]")


def _needs_wrapper(obj: object, owner: str, name: str) -> bool:
    """Whether ``obj`` (``owner.name``) is a compiled function ``inspect`` cannot describe right."""
    if type(obj).__name__ == "Function compiled with mypyc":
        return sys.version_info < (3, 12) and name in _PYTHON_COROUTINES.get(owner, ())
    if not isinstance(obj, (BuiltinFunctionType, MethodDescriptorType)) or name.startswith("_"):
        return False
    text = getattr(obj, "__text_signature__", None)
    if not text or not _NAME_DEFAULT.search(text):
        return False  # no default that inspect must look up (or no signature at all)
    try:
        inspect.signature(obj)
    except (ValueError, AttributeError):  # AttributeError: a default in a module still being imported
        return True
    return False


def _python_wrapper(native: Any, module: ModuleType, owner: type | None) -> FunctionType | None:
    """A Python function of ``native``'s source signature and docstring that calls it: its ``def``
    compiled with the body ``return native(...)`` (``await``-ed for an ``async def``) in the module's
    namespace, as ``_stub_signature`` does. None when the source cannot be found."""
    tree = _source(module)
    node: ast.AST | None = tree
    name = str(getattr(native, "__name__", "")).rsplit(".", 1)[-1]
    for part in (owner.__qualname__.split(".") if owner is not None else []):
        body = getattr(node, "body", [])
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
    found = next((n for n in getattr(node, "body", []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and n.name == name), None)
    if tree is None or found is None:
        return None
    args = found.args
    call = [a.arg for a in (*args.posonlyargs, *args.args)]
    call += [f"*{args.vararg.arg}"] if args.vararg else []
    call += [f"{a.arg}={a.arg}" for a in args.kwonlyargs]
    call += [f"**{args.kwarg.arg}"] if args.kwarg else []
    is_async = isinstance(found, ast.AsyncFunctionDef)
    forward = ast.parse(f"def f():\n    return {'await ' if is_async else ''}__compiled__({', '.join(call)})\n").body[0]
    stub = copy.copy(found)
    docstring = found.body[:1] if ast.get_docstring(found, clean=False) is not None else []
    stub.body = [*docstring, *forward.body]  # type: ignore[attr-defined]
    stub.decorator_list = []
    for statement in forward.body:  # type: ignore[attr-defined]
        ast.increment_lineno(statement, found.lineno)
    future = ast.ImportFrom(module="__future__", names=[ast.alias(name="annotations")], level=0)
    code = ast.fix_missing_locations(ast.Module(body=[future, stub], type_ignores=[]))
    namespace = {**vars(module), "__compiled__": native}
    try:
        exec(compile(code, getattr(module, "__file__", None) or "?", "exec"), namespace)
    except Exception:  # a default that needs the class body's names: left as it is
        return None
    wrapper: FunctionType = namespace[found.name]
    wrapper.__module__ = module.__name__
    wrapper.__qualname__ = f"{owner.__qualname__}.{found.name}" if owner is not None else found.name
    return wrapper


def _sign_coroutine(func: object, module: ModuleType) -> None:
    """A compiled ``async def`` is a "Function compiled with mypyc", not a builtin: ``inspect`` reads
    its empty ``__code__``. From Python 3.12 it has a ``__dict__``, which takes the signature (and the
    build sets its ``__doc__``); before, it has neither."""
    code = getattr(func, "__code__", None)
    if type(func).__name__ != "Function compiled with mypyc" or not isinstance(code, CodeType):
        return
    path = module.__name__.replace(".", "/")
    if code.co_filename and not code.co_filename.endswith((f"{path}.py", f"{path}/__init__.py")):
        return  # imported from another module (methods have no file name: their class's module)
    if "__signature__" in getattr(func, "__dict__", ()):
        return
    if getattr(func, "__module__", None) is None:
        with contextlib.suppress(AttributeError, TypeError):
            func.__module__ = module.__name__
    lines = _source_lines(module)
    start = code.co_firstlineno - 1
    for end in range(start + 1, min(start + 60, len(lines)) + 1):
        header = textwrap.dedent("".join(lines[start:end]))
        if not header.rstrip().endswith(":"):
            continue
        try:
            node = ast.parse(header + "\n    pass\n").body[0]
        except SyntaxError:
            continue
        if isinstance(node, ast.AsyncFunctionDef) and node.name == str(getattr(func, "__name__", "")).rsplit(".", 1)[-1]:
            signature = _stub_signature(node, module, method=False)
            if signature is not None:
                with contextlib.suppress(AttributeError, TypeError):
                    func.__signature__ = signature  # type: ignore[attr-defined]
        return


class _CompiledSignature:
    """The ``__signature__`` of compiled classes (a class attribute: instances have none)."""

    def __init__(self) -> None:
        self._cache: dict[type, inspect.Signature | None] = {}

    def __get__(self, instance: object, owner: type | None = None) -> inspect.Signature:
        if instance is None and owner is not None:
            for cls in owner.__mro__:
                module = sys.modules.get(cls.__module__)
                init = cls.__dict__.get("__init__")
                if module is not None and is_compiled(module):
                    if cls not in self._cache:
                        self._cache[cls] = _init_signature(cls, module)
                    found = self._cache[cls]
                    if found is not None:
                        return found
                    if isinstance(init, FunctionType):  # set at run time (a Protocol's)
                        return _bound(inspect.signature(init))
                elif cls is object:
                    return inspect.signature(object)  # no constructor anywhere: "()", as inspect says
                elif init is not None or "__new__" in cls.__dict__:
                    break  # an interpreted class's own constructor: inspect's usual way
        raise AttributeError("__signature__")


_COMPILED_SIGNATURE = _CompiledSignature()
_SOURCES: dict[str, ast.Module | None] = {}
_LINES: dict[str, list[str]] = {}


def _source_lines(module: ModuleType) -> list[str]:
    """The lines of the ``.py`` file shipped next to ``module``'s extension module."""
    if module.__name__ not in _LINES:
        origin = Path(getattr(module, "__file__", None) or "")
        try:
            text = origin.with_name(origin.name.split(".", 1)[0] + ".py").read_text(encoding="utf-8")
        except (OSError, ValueError):
            text = ""
        _LINES[module.__name__] = text.splitlines(keepends=True)
    return _LINES[module.__name__]


def _source(module: ModuleType) -> ast.Module | None:
    """The parsed ``.py`` source of ``module`` (None without one)."""
    if module.__name__ not in _SOURCES:
        try:
            _SOURCES[module.__name__] = ast.parse("".join(_source_lines(module))) if _source_lines(module) else None
        except (SyntaxError, ValueError):
            _SOURCES[module.__name__] = None
    return _SOURCES[module.__name__]


def _bound(signature: inspect.Signature) -> inspect.Signature:
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def _init_signature(cls: type, module: ModuleType) -> inspect.Signature | None:
    """``inspect.signature(cls)`` of the pure package when ``cls``'s source defines ``__init__``:
    its ``def`` line compiled with an empty body in the module's namespace (annotations stay the
    same strings, defaults are the same objects). None when the source has no ``__init__``."""
    tree = _source(module)
    node: ast.AST | None = tree
    for part in cls.__qualname__.split("."):
        body = getattr(node, "body", [])
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
    init = next((n for n in getattr(node, "body", []) if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None)
    if tree is None or init is None:
        return None
    return _stub_signature(init, module, method=True)


def _stub_signature(node: ast.FunctionDef | ast.AsyncFunctionDef, module: ModuleType, *, method: bool,
                    ) -> inspect.Signature | None:
    """The signature of ``node``'s ``def`` compiled with an empty body in the module's namespace, as
    the pure module would (annotations stay strings: every compiled module has ``from __future__
    import annotations``; defaults are the module's objects). ``method``: without the first parameter."""
    stub = copy.copy(node)
    stub.body = [ast.Pass(lineno=node.lineno, col_offset=node.col_offset)]
    stub.decorator_list = []
    future = ast.ImportFrom(module="__future__", names=[ast.alias(name="annotations")], level=0)
    tree = ast.fix_missing_locations(ast.Module(body=[future, stub], type_ignores=[]))
    namespace = dict(vars(module))
    try:
        exec(compile(tree, getattr(module, "__file__", None) or "?", "exec"), namespace)
        signature = inspect.signature(namespace[node.name])
    except Exception:  # a default that needs the class body's names: no signature rather than a wrong one
        return None
    return _bound(signature) if method else signature
