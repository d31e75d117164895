"""``mypyc_attr`` for the modules that may be compiled with mypyc, without a runtime dependency.

mypy and mypyc see ``mypy_extensions.mypyc_attr`` (so ``allow_interpreted_subclasses`` is
honoured when the hot-path modules are compiled); at run time this is a no-op decorator, so
``mypy_extensions`` is never imported. This module itself is never compiled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["mypyc_attr"]

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr as mypyc_attr
else:

    def mypyc_attr(*attrs: str, **kwattrs: Any) -> Any:
        return lambda cls: cls
