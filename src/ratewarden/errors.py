"""Every error ratewarden raises on purpose, under one base: ``except RatewardenError`` catches them.

- ``ConfigurationError`` (also a ``ValueError``): something given at start-up cannot be used: a
  rate string, an algorithm name, a store URL, a policy file
  (``ratewarden.policy.PolicyError``, which lists every problem found), an option of a
  ``Limiter``, ``Rule``, store, middleware or policy section, an argument an operation cannot
  use (``Bans.block`` for ``-1`` seconds). Raised when the value is given, never at the first
  request.
- ``StoreError``: a store could not answer (unreachable, timed out, an error reply); the
  original exception is kept as ``__cause__``, and ``reason`` says which (``"timeout"``,
  ``"unreachable"`` or ``"error"``).
- ``LimitUnavailable``: a limit could not be checked and the failure policy is fail-closed, so
  the request is refused (503) rather than let through unchecked.
- ``AmbiguousRequest`` (a ``LimitUnavailable``): the request repeats a keyed query parameter with
  different values, so who to charge is ambiguous; refused (400) whatever the failure policy.

- ``RateLimitExceeded``: a request is over its limit (``decision`` says which limit and when to
  retry). The FastAPI dependency raises ``ratewarden.fastapi.RateLimitExceeded`` (a Starlette
  ``HTTPException``) and the Flask extension ``ratewarden.flask.RateLimitExceeded`` (a werkzeug
  ``TooManyRequests``): both are this class, each also its framework's HTTP exception, so this
  module needs neither framework.
- ``ArgumentError`` (also a ``ValueError``): a value given with one call rather than at start-up
  cannot be used (a negative ``cost`` given to ``Limiter.hit``; ``Store.adjust`` given keys, limits
  and amounts of different lengths).
- ``UsageError`` (also a ``RuntimeError``): ratewarden was called where it cannot work (a sync
  call on its own loop thread, a Flask view of an app ``init_app`` was not called for, a reload or
  a ban on a middleware not given a policy file or bans).
- The ``ratewarden serve`` errors: ``ServeError`` (a /check request it cannot decide),
  ``RlsRequestError`` (an Envoy RLS request it cannot answer, also a ``ValueError``) and
  ``SpopError`` (a HAProxy SPOP frame it cannot use), defined with the service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .decision import Decision

__all__ = [
    "AmbiguousRequest",
    "ArgumentError",
    "ConfigurationError",
    "LimitUnavailable",
    "RateLimitExceeded",
    "RatewardenError",
    "StoreError",
    "UsageError",
]


class RatewardenError(Exception):
    """The base of every error ratewarden raises on purpose."""


class ConfigurationError(RatewardenError, ValueError):
    """A value given at start-up cannot be used; the message names it and shows a valid one."""


class ArgumentError(RatewardenError, ValueError):
    """A value given with one call (not configuration) cannot be used; the message names it."""


class UsageError(RatewardenError, RuntimeError):
    """ratewarden was called where it cannot work; the message says what to do instead."""


class RateLimitExceeded(RatewardenError):
    """A request is over its limit; ``decision`` is the denying decision.

    The framework integrations raise subclasses that are also their framework's HTTP exception
    (``ratewarden.fastapi.RateLimitExceeded``, ``ratewarden.flask.RateLimitExceeded``), so
    ``except RateLimitExceeded`` (or an exception handler registered for it) catches either.
    """

    decision: Decision


class StoreError(RatewardenError):
    """A store could not answer (unreachable, timed out, broken reply).

    Args:
        *args: The message, as for any exception.
        reason: Why: ``"timeout"`` (no reply in time), ``"unreachable"`` (connection refused, reset,
            closed) or ``"error"`` (anything else: an error reply, a broken reply); counted by
            ``Limiter.without_store``.
    """

    #: ``"timeout"``, ``"unreachable"`` or ``"error"``.
    reason: str = "error"

    def __init__(self, *args: object, reason: str = "error") -> None:
        super().__init__(*args)
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:  # keep ``reason`` across pickling (processes)
        return (_store_error, (type(self), self.args, self.reason), self.__dict__)


class LimitUnavailable(RatewardenError):
    """The limit could not be checked and the policy is fail-closed: answer 503."""


class AmbiguousRequest(LimitUnavailable):
    """The request names its caller twice, differently (``?api_key=a&api_key=b``): frameworks
    disagree on which one the application reads (Flask the first, Django and Starlette the last),
    so no key can be charged without letting one of them through uncharged. Refused with 400 (the
    message says what to send instead) whatever the failure policy; a ``LimitUnavailable``, so
    code that refuses those refuses this too."""

    status = 400


def _store_error(kind: type[StoreError], args: tuple[object, ...], reason: str) -> StoreError:
    error = kind(*args)
    error.reason = reason
    return error

