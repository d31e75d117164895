"""``value_of`` and ``set_value``: ``mapping.get(key)`` and ``mapping[key] = value`` for ASGI scopes
and messages, as dict operations when they are dicts.

A scope or message is typed as a mapping (``ratewarden.types``), so compiled code would look ``get``
up as a method on every request; they are dicts in practice, which these use directly.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

__all__ = ["set_value", "value_of"]


def value_of(mapping: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``mapping.get(key, default)``.

    Args:
        mapping: An ASGI scope, message or state.
        key: What to read.
        default: The answer when ``key`` is missing.
    """
    if isinstance(mapping, dict):
        return mapping.get(key, default)
    return mapping.get(key, default)


def set_value(mapping: MutableMapping[str, Any], key: str, value: Any) -> None:
    """``mapping[key] = value``.

    Args:
        mapping: An ASGI scope, message or state.
        key: What to set.
        value: Its new value.
    """
    if isinstance(mapping, dict):
        mapping[key] = value
    else:
        mapping[key] = value
