"""The seven algorithms, each a pure function of (state, now, cost, rate)."""

from __future__ import annotations

from ..errors import ConfigurationError
from .base import Algorithm, State
from .fixed_window import fixed_window
from .gcra import gcra
from .leaky_bucket import leaky_bucket
from .sliding_log import sliding_log
from .sliding_window import sliding_window
from .token_bucket import token_bucket
from .token_bucket_debt import token_bucket_debt

__all__ = ["ALGORITHMS", "Algorithm", "State", "get_algorithm"]

ALGORITHMS: dict[str, Algorithm] = {
    "fixed_window": fixed_window,
    "sliding_window": sliding_window,
    "sliding_log": sliding_log,
    "token_bucket": token_bucket,
    "token_bucket_debt": token_bucket_debt,
    "leaky_bucket": leaky_bucket,
    "gcra": gcra,
}


def get_algorithm(name: str) -> Algorithm:
    """Look an algorithm up by name; the error lists the valid names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigurationError(f"unknown algorithm {name!r}; choose one of: {', '.join(ALGORITHMS)}") from None
