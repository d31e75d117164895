"""Checking, when a limit is declared, that a key or cost function can be called the way its
integration calls it: a wrong signature is a ``ConfigurationError`` at start-up, not a
``TypeError`` on every request."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError

__all__ = ["accepts", "require_arguments"]


def accepts(func: Callable[..., Any], count: int) -> bool | None:
    """Whether ``func`` can be called with ``count`` positional arguments (and nothing else);
    ``None`` when its signature cannot be read (some builtins).

    Args:
        func: The function.
        count: How many positional arguments it would be given.
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True


def _own(func: Callable[..., Any]) -> bool:
    """One of ratewarden's own functions or objects (``client_ip``, ``header(...)``...): they take
    the scope (a compiled class's ``__signature__`` would describe its constructor instead)."""
    module = getattr(func, "__module__", None) or type(func).__module__
    return isinstance(module, str) and (module == "ratewarden" or module.startswith("ratewarden."))


def describe(func: Callable[..., Any]) -> str:
    """``name(parameters)`` for messages.

    Args:
        func: The function.
    """
    name = getattr(func, "__name__", None) or type(func).__name__
    try:
        return f"{name}{inspect.signature(func)}"
    except (TypeError, ValueError):
        return str(name)


def require_arguments(func: Callable[..., Any], count: int, what: str, expected: str) -> None:
    """Refuse ``func`` unless it can be called with ``count`` positional arguments.

    Args:
        func: A key or cost function given by the application.
        count: How many positional arguments the integration gives it.
        what: What it is, for the message (``"Rule('/api/**') key"``).
        expected: How it is called, for the message (``"one argument, the request's scope"``).
    """
    if _own(func) or accepts(func, count) is not False:
        return
    raise ConfigurationError(f"{what}: {describe(func)} cannot be called with {expected}")
