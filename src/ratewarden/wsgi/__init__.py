"""WSGI integration (PEP 3333): the request as a scope (``scope_of``) for the check layer."""

from .scope import SCOPE_KEY, scope_of

__all__ = ["SCOPE_KEY", "scope_of"]
