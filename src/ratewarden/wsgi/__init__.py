"""WSGI integration (PEP 3333): ``RateLimitMiddleware`` for synchronous apps (Flask, Django, any
WSGI callable), and the request as a scope (``scope_of``) for the check layer."""

from .. import _mypyc
from .middleware import LimitHandler, RateLimitMiddleware
from .scope import CONTEXT_KEY, SCOPE_KEY, scope_of

# The compiled classes loaded just now get the pure package's signatures (``import ratewarden``
# gave them to the modules loaded before).
_mypyc.attach_signatures()

__all__ = ["CONTEXT_KEY", "SCOPE_KEY", "LimitHandler", "RateLimitMiddleware", "scope_of"]
