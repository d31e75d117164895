"""Every error ratewarden raises on purpose, under one base: ``except RatewardenError`` catches them.

- ``ConfigurationError`` (also a ``ValueError``): something given at start-up cannot be used: a
  rate string, an algorithm name, a store URL, a policy file
  (``ratewarden.policy.PolicyError``, which lists every problem found). Raised when the
  value is given, never at the first request.
- ``StoreError``: a store could not answer (unreachable, timed out, an error reply); the
  original exception is kept as ``__cause__``, and ``reason`` says which (``"timeout"``,
  ``"unreachable"`` or ``"error"``).
- ``LimitUnavailable``: a limit could not be checked and the failure policy is fail-closed, so
  the request is refused (503) rather than let through unchecked.

``ratewarden.fastapi.RateLimitExceeded`` (a request over its limit, raised by the FastAPI
dependency) is also a ``RatewardenError``, and a Starlette ``HTTPException``.
"""

from __future__ import annotations

__all__ = ["ConfigurationError", "LimitUnavailable", "RatewardenError", "StoreError"]


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


def _store_error(kind: type[StoreError], args: tuple[object, ...], reason: str) -> StoreError:
    error = kind(*args)
    error.reason = reason
    return error
