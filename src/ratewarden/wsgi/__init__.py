"""WSGI integration (PEP 3333): ``RateLimitMiddleware`` for synchronous apps (Flask, Django, any
WSGI callable), and the request as a scope (``scope_of``) for the check layer."""

from .middleware import LimitHandler, RateLimitMiddleware
from .scope import CONTEXT_KEY, SCOPE_KEY, scope_of

__all__ = ["CONTEXT_KEY", "SCOPE_KEY", "LimitHandler", "RateLimitMiddleware", "scope_of"]
