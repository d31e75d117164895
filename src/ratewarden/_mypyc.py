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
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType
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
    """
    prefix = package + "."
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix) or not is_compiled(module):
            continue
        for obj in list(vars(module).values()):
            if (isinstance(obj, type) and obj.__module__ == name and "__signature__" not in obj.__dict__
                    and not getattr(obj, "_is_protocol", False)):
                with contextlib.suppress(TypeError, AttributeError):  # an immutable type: its text signature
                    obj.__signature__ = _COMPILED_SIGNATURE  # type: ignore[attr-defined]


class _CompiledSignature:
    """The ``__signature__`` of compiled classes (a class attribute: instances have none)."""

    def __init__(self) -> None:
        self._cache: dict[type, inspect.Signature | None] = {}

    def __get__(self, instance: object, owner: type | None = None) -> inspect.Signature:
        if instance is None and owner is not None:
            for cls in owner.__mro__:
                module = sys.modules.get(cls.__module__)
                if module is not None and is_compiled(module):
                    if cls not in self._cache:
                        self._cache[cls] = _init_signature(cls, module)
                    found = self._cache[cls]
                    if found is not None:
                        return found
                elif "__init__" in cls.__dict__ or "__new__" in cls.__dict__:
                    break  # an interpreted class's own constructor: inspect's usual way
        raise AttributeError("__signature__")


_COMPILED_SIGNATURE = _CompiledSignature()
_SOURCES: dict[str, ast.Module | None] = {}


def _source(module: ModuleType) -> ast.Module | None:
    """The parsed ``.py`` file shipped next to ``module``'s extension module (None without one)."""
    if module.__name__ not in _SOURCES:
        origin = Path(getattr(module, "__file__", None) or "")
        path = origin.with_name(origin.name.split(".", 1)[0] + ".py")
        try:
            _SOURCES[module.__name__] = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (OSError, SyntaxError, ValueError):
            _SOURCES[module.__name__] = None
    return _SOURCES[module.__name__]


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
    stub = copy.copy(init)
    stub.body = [ast.Pass(lineno=init.lineno, col_offset=init.col_offset)]
    stub.decorator_list = []
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    code = compile(ast.Module(body=[*future, stub], type_ignores=[]), getattr(module, "__file__", "?"), "exec")
    namespace = dict(vars(module))
    try:
        exec(code, namespace)
        signature = inspect.signature(namespace["__init__"])
    except Exception:  # a default that needs the class body's names: no signature rather than a wrong one
        return None
    return signature.replace(parameters=list(signature.parameters.values())[1:])
