"""Failures of the Redis client as ``StoreError``: the one place their messages are built.

Every message starts ``redis store <url>:``; a client exception keeps its type and text, plus
its root cause when the client left it out (older redis-py omits e.g. the SSL verification
error), and stays the ``StoreError``'s ``__cause__``.
"""

from __future__ import annotations

from ...errors import StoreError
from .protocol import Reply

try:
    from redis.exceptions import RedisError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("RedisStore needs the redis client: pip install 'ratewarden[redis]'") from exc

__all__ = ["CLIENT_ERRORS", "CONNECTION_ERRORS", "bad_reply", "pool_busy", "store_error", "timed_out"]

#: What the client raises when the server cannot be reached or answers with an error.
CONNECTION_ERRORS = (RedisError, OSError)
#: What a check's client call may raise (RuntimeError: a loop closed under a connection).
CLIENT_ERRORS = (RedisError, OSError, RuntimeError)


def store_error(url: str, exc: BaseException) -> StoreError:
    """``exc`` (a client failure) as a ``StoreError`` naming the store; one already is as is."""
    if isinstance(exc, StoreError):
        return exc
    message = f"{type(exc).__name__}: {exc}"
    root = exc  # the reason itself (e.g. the SSL verification error), which older redis-py omits
    while (root.__cause__ or root.__context__) is not None and root is not (root.__cause__ or root.__context__):
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    if root is not exc and str(root) not in message:
        message += f" ({type(root).__name__}: {root})"
    error = StoreError(f"redis store {url}: {message}")
    error.__cause__ = exc  # also where the error reaches its callers through a future, not a raise
    return error


def timed_out(url: str, timeout: float) -> StoreError:
    """No reply within ``timeout`` seconds."""
    return StoreError(f"redis store {url}: no reply within {timeout * 1000:g} ms")


def pool_busy(url: str, timeout: float, connections: int, pool_size: int) -> StoreError:
    """No reply within ``timeout`` seconds, part of them spent waiting for one of the pool's
    ``connections`` (more checks at once than the pool has connections)."""
    return StoreError(
        f"redis store {url}: no reply within {timeout * 1000:g} ms, part of it spent waiting for a free"
        f" connection: all {connections} connections of the client's pool were busy (pool_size={pool_size})"
    )


def bad_reply(url: str, reply: Reply) -> StoreError:
    """A script reply of the wrong shape (raise it from the decoding error)."""
    return StoreError(f"redis store {url}: unexpected script reply {reply!r}")
