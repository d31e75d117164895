"""Every error ratewarden raises on purpose, under one base: ``except RatewardenError`` catches them.

- ``ConfigurationError`` (also a ``ValueError``): something given at start-up cannot be used: a
  rate string, an algorithm name, a store URL, a policy file
  (``ratewarden.policy.PolicyError``, which lists every problem found), an option of a
  ``Limiter``, ``Rule``, store, middleware or policy section, an argument an operation cannot
  use (``Bans.block`` for ``-1`` seconds). Raised when the value is given, never at the first
  request. A plain ``ValueError`` is left only for values that come with each call rather
  than from configuration (a negative ``cost`` given to ``Limiter.hit``; ``Store.adjust``
  given keys, limits and amounts of different lengths).
- ``StoreError``: a store could not answer (unreachable, timed out, an error reply); the
  original exception is kept as ``__cause__``, and ``reason`` says which (``"timeout"``,
  ``"unreachable"`` or ``"error"``).
- ``LimitUnavailable``: a limit could not be checked and the failure policy is fail-closed, so
  the request is refused (503) rather than let through unchecked.
- ``AmbiguousRequest`` (a ``LimitUnavailable``): the request repeats a keyed query parameter with
  different values, so who to charge is ambiguous; refused (400) whatever the failure policy.

``RateLimitExceeded`` (a request over its limit, raised by the FastAPI dependency) is also a
``RatewardenError``, and a Starlette ``HTTPException``. It is defined in ``ratewarden.fastapi``
(it needs FastAPI); ``from ratewarden.errors import RateLimitExceeded`` works too, importing
``ratewarden.fastapi`` on first use, so the core never imports FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .fastapi import RateLimitExceeded as RateLimitExceeded  # for type checkers; lazy below

# ``RateLimitExceeded`` is left out of ``__all__``: ``from ratewarden.errors import *`` must not
# need FastAPI.
__all__ = ["AmbiguousRequest", "ConfigurationError", "LimitUnavailable", "RatewardenError", "StoreError"]


class RatewardenError(Exception):
    """The base of every error ratewarden raises on purpose."""


class ConfigurationError(RatewardenError, ValueError):
    """A value given at start-up cannot be used; the message names it and shows a valid one."""


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


def __getattr__(name: str) -> object:
    # ``RateLimitExceeded`` is an ``HTTPException``: defined with the FastAPI integration, and
    # imported from there only when asked for (FastAPI is an optional extra).
    if name == "RateLimitExceeded":
        try:
            from .fastapi import RateLimitExceeded
        except ModuleNotFoundError as exc:
            raise ImportError(
                f"ratewarden.errors.RateLimitExceeded is the FastAPI dependency's error and needs FastAPI "
                f"(pip install 'ratewarden[fastapi]'): {exc}"
            ) from exc
        return RateLimitExceeded
    raise AttributeError(f"module 'ratewarden.errors' has no attribute {name!r}")
