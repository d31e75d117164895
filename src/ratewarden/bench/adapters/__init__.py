"""Library adapters, imported lazily by name so a missing peer only disables its own rows."""

from __future__ import annotations

import importlib
from typing import NamedTuple

from .base import Adapter, StoreSpec, Unsupported

__all__ = ["LIBRARIES", "OPT_IN", "Adapter", "Library", "StoreSpec", "Unsupported", "load"]


class Library(NamedTuple):
    """Where a library's adapter is, and whether it runs by default."""

    module: str  #: the module in this package
    adapter: str  #: its class there
    dist: str  #: the distribution to install when the module does not import
    opt_in: bool = False  #: run only when named (``--library``, ``--rlflx``), not by default


_RLFLX = Library("rlflx", "RlflxAdapter", "ratewarden", opt_in=True)
#: Every library by name. The ones run only when named: rate-limiter-flexible behind fastify (Node; live
#: rows only, run by bench.rlflx), and the Litestar pair, measured against bare Litestar
#: (results.baseline_of): Litestar's own RateLimitConfig and ratewarden.litestar's plugin.
LIBRARIES: dict[str, Library] = {
    "ratewarden": Library("ratewarden", "RatewardenAdapter", "ratewarden"),
    "traffik": Library("traffik", "TraffikAdapter", "traffik"),
    "slowapi": Library("slowapi", "SlowapiAdapter", "slowapi"),
    "limits": Library("limits_aio", "LimitsAdapter", "limits"),
    "bare": Library("bare", "BareAdapter", "fastapi"),
    "rlflx-ioredis": _RLFLX,
    "rlflx-iovalkey": _RLFLX,
    "rlflx-glide": _RLFLX,
    "fastify-bare": _RLFLX,
    "litestar-bare": Library("litestar", "LitestarBareAdapter", "litestar", opt_in=True),
    "litestar": Library("litestar", "LitestarAdapter", "litestar", opt_in=True),
    "ratewarden-litestar": Library("litestar", "RatewardenLitestarAdapter", "litestar", opt_in=True),
}
#: Libraries run only when named (``--library``, ``--rlflx``), not by default.
OPT_IN = frozenset(name for name, library in LIBRARIES.items() if library.opt_in)


def load(name: str) -> type[Adapter]:
    """The adapter class for ``name``; ``KeyError`` if unknown, ``ImportError`` naming the package to install."""
    library = LIBRARIES[name]
    try:
        mod = importlib.import_module(f"{__name__}.{library.module}")
    except ImportError as exc:
        raise ImportError(f"the {name} adapter needs {library.dist!r} ({exc}); install it with "
                          f"pip install 'ratewarden[bench]'") from exc
    adapter: type[Adapter] = getattr(mod, library.adapter)
    return adapter
