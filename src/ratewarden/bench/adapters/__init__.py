"""Library adapters, imported lazily by name so a missing peer only disables its own rows."""

from __future__ import annotations

import importlib

from .base import Adapter, StoreSpec, Unsupported

__all__ = ["LIBRARIES", "OPT_IN", "Adapter", "StoreSpec", "Unsupported", "load"]

# name -> (module, class, the distribution to install when the import fails): the libraries run by default.
_BY_DEFAULT: dict[str, tuple[str, str, str]] = {
    "ratewarden": ("ratewarden", "RatewardenAdapter", "ratewarden"),
    "traffik": ("traffik", "TraffikAdapter", "traffik"),
    "slowapi": ("slowapi", "SlowapiAdapter", "slowapi"),
    "limits": ("limits_aio", "LimitsAdapter", "limits"),
    "bare": ("bare", "BareAdapter", "fastapi"),
}
# The libraries run only when named (``--library``, ``--rlflx``): rate-limiter-flexible behind fastify
# (Node; live rows only, run by bench.rlflx), and the Litestar pair, measured against bare Litestar
# (results.baseline_of): Litestar's own RateLimitConfig and ratewarden.litestar's plugin.
_WHEN_NAMED: dict[str, tuple[str, str, str]] = {
    "rlflx-ioredis": ("rlflx", "RlflxAdapter", "ratewarden"),
    "rlflx-iovalkey": ("rlflx", "RlflxAdapter", "ratewarden"),
    "rlflx-glide": ("rlflx", "RlflxAdapter", "ratewarden"),
    "fastify-bare": ("rlflx", "RlflxAdapter", "ratewarden"),
    "litestar-bare": ("litestar", "LitestarBareAdapter", "litestar"),
    "litestar": ("litestar", "LitestarAdapter", "litestar"),
    "ratewarden-litestar": ("litestar", "RatewardenLitestarAdapter", "litestar"),
}
#: Every library: name -> (module, class, the distribution to install when the import fails).
LIBRARIES: dict[str, tuple[str, str, str]] = {**_BY_DEFAULT, **_WHEN_NAMED}
#: Libraries run only when named (``--library``, ``--rlflx``), not by default.
OPT_IN = frozenset(_WHEN_NAMED)


def load(name: str) -> type[Adapter]:
    """The adapter class for ``name``; ``KeyError`` if unknown, ``ImportError`` naming the package to install."""
    module, cls, dist = LIBRARIES[name]
    try:
        mod = importlib.import_module(f"{__name__}.{module}")
    except ImportError as exc:
        raise ImportError(f"the {name} adapter needs {dist!r} ({exc}); install it with "
                          f"pip install 'ratewarden[bench]'") from exc
    adapter: type[Adapter] = getattr(mod, cls)
    return adapter
