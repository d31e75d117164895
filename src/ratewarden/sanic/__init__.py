"""Sanic integration: ``RateLimiter``, a Sanic extension (app-wide ``rules`` and per-route
``@limiter.limit``) written only against the check layer (``ratewarden.enforcement``): the same
keys, stores, failure policy and answers as every other integration."""

try:
    import sanic  # noqa: F401
except ImportError:  # pragma: no cover - the sanic extra is not installed
    raise ImportError("ratewarden.sanic needs Sanic: pip install 'ratewarden[sanic]'") from None

from .extension import CONTEXT_ATTR, RateLimiter
from .scope import scope_of

__all__ = ["CONTEXT_ATTR", "RateLimiter", "scope_of"]
