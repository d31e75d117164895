"""Support for the optional mypyc-compiled hot path (see ``setup.py``). This module is never compiled.

``mypyc_attr``: mypy and mypyc see ``mypy_extensions.mypyc_attr`` (so ``allow_interpreted_subclasses``
is honoured when the hot-path modules are compiled); at run time it is a no-op decorator, so
``mypy_extensions`` is never imported and the package keeps no runtime dependency.
"""

from __future__ import annotations

import abc
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from types import ModuleType
from typing import TYPE_CHECKING, Any

__all__ = ["is_compiled", "mypyc_attr", "repair_compiled_abcs"]

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
