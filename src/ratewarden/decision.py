"""The answer to one rate-limit check."""

from __future__ import annotations

import math

from ._mypyc import mypyc_attr

__all__ = ["Decision"]


@mypyc_attr(allow_interpreted_subclasses=True)
class Decision:
    """Outcome of a check.

    Args:
        allowed: Whether the request may proceed.
        limit: The limit's size in units of cost (``Rate.limit``).
        remaining: What is left after this request.
        reset_after: Seconds until the limit is fully restored.
        retry_after: Seconds until a request of the same cost would be allowed: 0 when allowed,
            ``math.inf`` when the cost can never fit the limit.
        period: The limit's period in seconds (0 when unknown).
        policy: The deciding limit's name, as the ``RateLimit-Policy`` header shows it (``""`` when
            unnamed).
    """

    __slots__ = ("allowed", "limit", "period", "policy", "remaining", "reset_after", "retry_after")

    def __init__(
        self,
        allowed: bool,
        limit: int,
        remaining: int,
        reset_after: float,
        retry_after: float,
        period: float = 0.0,
        policy: str = "",
    ) -> None:
        self.allowed = allowed
        self.limit = limit
        self.remaining = remaining
        self.reset_after = reset_after
        self.retry_after = retry_after
        self.period = period
        self.policy = policy

    def __repr__(self) -> str:
        return (
            f"Decision(allowed={self.allowed}, limit={self.limit}, remaining={self.remaining}, "
            f"reset_after={self.reset_after:.6g}, retry_after={self.retry_after:.6g})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Decision):
            return NotImplemented
        return (
            self.allowed == other.allowed
            and self.limit == other.limit
            and self.remaining == other.remaining
            and math.isclose(self.reset_after, other.reset_after, abs_tol=1e-6)
            and math.isclose(self.retry_after, other.retry_after, abs_tol=1e-6)
        )

    __hash__ = None  # type: ignore[assignment]

    def to_dict(self) -> dict[str, object]:
        """Plain-data view (for JSON, logs and stats)."""
        return {
            "allowed": self.allowed,
            "limit": self.limit,
            "remaining": self.remaining,
            "reset_after": self.reset_after,
            "retry_after": self.retry_after,
            "policy": self.policy,
        }
