"""What the Redis client raises, and the ``StoreError`` helpers for the parts of ``RedisStore``
that hold its URL rather than the store (the pipeline): they name the store as its ``repr`` does
and use the one mapping in ``stores.base`` (``client_error``, ``no_reply``).
"""

from __future__ import annotations

from ...errors import StoreError
from ..base import client_error, no_reply
from ._redis import RedisConnectionError, RedisError, ResponseError
from .protocol import Reply

__all__ = [
    "CLIENT_ERRORS", "CONNECTION_ERRORS", "RESENDS", "bad_reply", "closed_under", "pool_busy", "refused_as_late", "store_error",
    "store_name", "timed_out",
]

#: What the client raises when the server cannot be reached or answers with an error.
CONNECTION_ERRORS = (RedisError, OSError)
#: What a check's client call may raise (RuntimeError: a loop closed under a connection).
CLIENT_ERRORS = (RedisError, OSError, RuntimeError)

#: How many times a script refused as late is sent again with a fresh deadline while its caller waits.
RESENDS = 3


def closed_under(exc: AttributeError) -> Exception:
    """A call on a connection another task closed under it: redis-py then finds its reader or
    writer gone (``'NoneType' object has no attribute 'writelines'``): a connection error, which
    the store turns into its ``StoreError`` (``unreachable``). Any other ``AttributeError`` is
    returned as is (a bug, not the store).

    Args:
        exc: What the call raised.
    """
    if str(exc).startswith("'NoneType' object has no attribute"):
        error = RedisConnectionError(f"connection closed while in use ({exc})")
        error.__cause__ = exc
        return error
    return exc


def refused_as_late(reply: object) -> bool:
    """Whether ``reply`` is the script's refusal to run past its deadline: nothing was charged,
    so a caller still waiting may send the call again with a fresh deadline."""
    return isinstance(reply, ResponseError) and str(reply).startswith("ratewarden: expired")


def store_name(url: str) -> str:
    """How messages name the store at ``url`` (its ``repr``; the URL's password already hidden)."""
    return f"RedisStore({url!r})"


def store_error(url: str, exc: BaseException, operation: str = "pipelined call") -> StoreError:
    """``exc`` (a client failure) as a ``StoreError`` naming the store; one already is as is."""
    return client_error(store_name(url), operation, exc)


def timed_out(url: str, timeout: float, operation: str = "pipelined call") -> StoreError:
    """No reply within ``timeout`` seconds."""
    return no_reply(store_name(url), operation, timeout)


def pool_busy(url: str, operation: str, timeout: float, connections: int, pool_size: int) -> StoreError:
    """No reply within ``timeout`` seconds, part of them spent waiting for one of the pool's
    ``connections`` (more checks at once than the pool has connections)."""
    return StoreError(
        f"{store_name(url)}: {operation}: no reply within {timeout * 1000:g} ms, part of it spent waiting"
        f" for a free connection: all {connections} connections of the client's pool were busy"
        f" (pool_size={pool_size})",
        reason="timeout",
    )


def bad_reply(url: str, reply: Reply) -> StoreError:
    """A script reply of the wrong shape (raise it from the decoding error)."""
    return StoreError(f"{store_name(url)}: unexpected script reply {reply!r}")
