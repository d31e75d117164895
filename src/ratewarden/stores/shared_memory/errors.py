"""``SharedMemoryError``, the one error the shared-memory store raises on purpose."""

from __future__ import annotations

from ..._mypyc import mypyc_attr
from ..base import StoreError

__all__ = ["SharedMemoryError"]


@mypyc_attr(allow_interpreted_subclasses=True)
class SharedMemoryError(StoreError):
    """The shared-memory file cannot be used (wrong owner, permissions, layout), or the store is
    closed; a ``StoreError``, so a request that meets it follows the limiter's ``on_error``.

    Args:
        *args: The message, as for any exception.
        reason: ``StoreError.reason``; ``"error"`` unless given.
    """
