"""A store that does not answer, as a limiter sees it: why a check was decided without the store
(counted per process), what is wrong with the store in words, and the start-up check that asks
whether it answers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from .errors import RatewardenError
from .limits import Limit
from .stores.base import Store, StoreError, client_error, failure_reason
from .stores.protocols import HealthReporting

__all__ = [
    "STORE_CHECK_KEY", "STORE_CHECK_TIMEOUT", "WITHOUT_STORE_REASONS", "cached_rejections", "check_failure", "probe_store",
    "store_problem", "without_store_totals",
]

log = logging.getLogger("ratewarden")

#: Why a check was decided without the store (``Limiter.without_store``): the store's failure
#: (``timeout``, ``unreachable``, ``error``), who answered it instead (``local_limiter``), or
#: the store's own cache of rejections (``over_limit_cache``: ``protocols.HealthReporting``).
WITHOUT_STORE_REASONS = ("timeout", "unreachable", "error", "local_limiter", "over_limit_cache")
#: The reasons that are the store's failure (``StoreError.reason``).
FAILURE_REASONS = ("timeout", "unreachable", "error")
#: Each reason as a log line names it.
LABELS = {"timeout": "timeout", "unreachable": "unreachable", "error": "error", "local_limiter": "local limiter",
          "over_limit_cache": "over-limit cache"}
#: What ``Limiter.check_store`` reads (a peek of this key: nothing is written), and how long it waits.
STORE_CHECK_KEY = "ratewarden-store-check"
STORE_CHECK_TIMEOUT = 5.0
# Every limiter of this process (``ratewarden_checks_without_store_total`` in ``Metrics``).
_totals: dict[str, int] = dict.fromkeys((*FAILURE_REASONS, "local_limiter"), 0)


def without_store_totals() -> dict[str, int]:
    """``Limiter.without_store`` summed over every limiter of this process, without
    ``over_limit_cache`` (a count of the stores: ``Metrics`` reads it from the stores it watches)."""
    return dict(_totals)


def count_without_store(reason: str) -> None:
    """Add one check decided without the store to this process's totals (``without_store_totals``).

    Args:
        reason: A failure reason (``FAILURE_REASONS``) or ``"local_limiter"``.
    """
    _totals[reason] += 1


def cached_rejections(store: Store) -> int:
    """``store.cached_rejections`` (``protocols.HealthReporting``; 0 for a store without a cache of
    rejections), looking through wrappers (``Breaker``, ``Metrics.instrument``).

    Args:
        store: The limiter's store, wrapped or not.
    """
    for _ in range(8):  # wrappers of wrappers, bounded
        count = store.cached_rejections if isinstance(store, HealthReporting) else 0
        if count:
            return count
        inner = getattr(store, "inner", None) or getattr(store, "store", None)
        if not isinstance(inner, Store):
            return 0
        store = inner
    return 0


def innermost(store: Store) -> Store:
    """The store behind wrappers (``Breaker``, ``Metrics.instrument``), as ``cached_rejections`` finds it."""
    for _ in range(8):
        inner = getattr(store, "inner", None)
        if inner is None:
            inner = getattr(store, "store", None)
        if not isinstance(inner, Store):
            return store
        store = inner
    return store


async def probe_store(store: Store, keys: Sequence[str], limits: Sequence[Limit], timeout: float) -> StoreError | None:
    """Ask ``store`` whether it answers: a ``peek`` of ``keys``, which charges and writes nothing.
    Returns what went wrong as a ``StoreError`` (a timeout, or any other exception, wrapped), or
    ``None`` when the store answered. A store whose ``peek`` raises ``NotImplementedError`` raises it.

    Args:
        store: The store (not a wrapper of it).
        keys: The storage keys to peek.
        limits: The limit of each key.
        timeout: Seconds to wait for the answer, on top of the store's own timeouts.
    """
    error: StoreError
    started = time.monotonic()
    try:
        await asyncio.wait_for(store.peek(keys, limits), timeout)
    except StoreError as exc:
        error = exc
    except asyncio.TimeoutError:
        error = StoreError(f"{store!r}: start-up check: no reply within {timeout:g} s", reason="timeout")
    except NotImplementedError:  # a store of your own without peek: the caller decides
        raise
    except Exception as exc:  # a store that cannot even be asked: reported all the same
        error = StoreError(f"{store!r}: start-up check: {type(exc).__name__}: {exc}", reason=failure_reason(exc))
        error.__cause__ = exc
    else:
        log.debug("rate limit store %r answered its start-up check in %.1f ms", store, (time.monotonic() - started) * 1000)
        return None
    return error


def check_failure(store: Store, exc: Exception) -> StoreError:
    """What a check whose store raised ``exc`` counts as: a ``StoreError`` as is; any other exception
    (a bug in the store or its client, a corrupt local store: ``IndexError``, ``MemoryError``...) as
    a ``StoreError`` naming the store and the exception's type (``reason="error"``, ``exc`` its
    cause), so it is decided as every store failure is (counted, logged, the insurance limiter, 503
    under fail-closed), never let through unchecked. A ``RatewardenError`` that is not a
    ``StoreError`` (a configuration or argument error: the caller's) is raised again.

    Args:
        store: The limiter's store.
        exc: What the check raised.
    """
    if isinstance(exc, RatewardenError) and not isinstance(exc, StoreError):
        raise exc
    return client_error(repr(store), "hit", exc)


def log_without_store(store: Store, error: StoreError, since: dict[str, int], seconds: float) -> None:
    """The WARNING line about the checks a limiter decided without ``store`` in the last
    ``seconds``: how many, by reason, and what the store said last.

    Args:
        store: The limiter's store.
        error: The store's latest failure.
        since: The checks by reason (``WITHOUT_STORE_REASONS``) since the previous line.
        seconds: How long ago the first of them was.
    """
    total = sum(since[reason] for reason in FAILURE_REASONS) + since["over_limit_cache"]
    detail = ", ".join(f"{LABELS[reason]}: {since[reason]:,}" for reason in WITHOUT_STORE_REASONS if since[reason])
    name = repr(store)
    message = str(error)
    message = message[len(name) + 2:] if message.startswith(name + ": ") else f"{type(error).__name__}: {message}"
    log.warning(
        "rate limit check failed: %s: %s %s decided without the store in the last %.1f s (%s): %s",
        name, f"{total:,}", "check" if total == 1 else "checks", seconds, detail, message,
    )


def store_problem(error: BaseException) -> str:
    """What is wrong with a store, in words, from a ``StoreError`` and the client errors it wraps:
    authentication, permission, TLS, host name, unreachable, timeout, or an error reply.

    Args:
        error: What the store raised.
    """
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(chain) < 8 and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or current.__context__
    names = {kind.__name__ for exc in chain for kind in type(exc).__mro__}
    text = " ".join(str(exc) for exc in chain)
    if any(n.startswith("Authentication") for n in names) or any(
        word in text for word in ("WRONGPASS", "NOAUTH", "invalid username-password", "Authentication required")
    ):
        return "authentication failed (wrong or missing password or user name)"
    if "NOPERM" in text or "NoPermissionError" in names:
        return "permission denied (the user may not run the commands a check needs: ACL rules)"
    if "SSLError" in names or "SSLCertVerificationError" in names:
        return "TLS failed (certificate, CA or TLS settings)"
    if "gaierror" in names:
        return "host name not found (DNS)"
    reason = error.reason if isinstance(error, StoreError) else failure_reason(error)
    if reason == "unreachable":
        return "unreachable (connection refused, reset or closed: is the server running, are host and port right?)"
    if reason == "timeout":
        return "no reply in time (the server is down, paused, overloaded, or unreachable through a firewall)"
    return "the store answered with an error"


def outage_policy(on_error: str, store: Store, fallback: Store | None) -> str:
    """What a limiter does with the requests its limits apply to while its store does not answer,
    in words (the ERROR line of ``Limiter.check_store``).

    Args:
        on_error: The limiter's ``on_error``.
        store: The limiter's store (a ``Breaker`` has a fallback store of its own).
        fallback: The limiter's insurance limiter, if any.
    """
    if on_error == "closed":
        return "the requests its limits apply to get 503 (Limiter.hit raises StoreError)"
    if isinstance(getattr(store, "fallback", None), Store):
        return "checks are decided by the fallback store of the Breaker around it (each process counts alone)"
    if fallback is not None:
        return "checks are decided by the insurance limiter (each process counts alone)"
    return "the requests its limits apply to are let through unchecked (Limiter.hit raises StoreError)"
