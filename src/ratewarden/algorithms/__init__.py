"""The seven algorithms, each a pure function of (state, now, cost, rate)."""

from __future__ import annotations

from typing import Literal, cast

from ..errors import ConfigurationError
from .base import Algorithm, State
from .fixed_window import fixed_window
from .gcra import gcra
from .leaky_bucket import leaky_bucket
from .sliding_log import sliding_log
from .sliding_window import sliding_window
from .token_bucket import token_bucket
from .token_bucket_debt import token_bucket_debt

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmName", "State", "algorithm_name", "get_algorithm"]

AlgorithmName = Literal[
    "fixed_window", "sliding_window", "sliding_log", "token_bucket", "token_bucket_debt", "leaky_bucket", "gcra"
]
"""The algorithms by name (the ``algorithm=`` option everywhere; see the README's table)."""

ALGORITHMS: dict[str, Algorithm] = {
    "fixed_window": fixed_window,
    "sliding_window": sliding_window,
    "sliding_log": sliding_log,
    "token_bucket": token_bucket,
    "token_bucket_debt": token_bucket_debt,
    "leaky_bucket": leaky_bucket,
    "gcra": gcra,
}


def algorithm_name(name: str) -> AlgorithmName:
    """``name`` checked and typed as an algorithm name (for names read from files or options).

    Args:
        name: The name to check.
    """
    get_algorithm(name)
    return cast(AlgorithmName, name)


def get_algorithm(name: str) -> Algorithm:
    """Look an algorithm up by name; the error lists the valid names.

    Args:
        name: ``fixed_window``, ``sliding_window``, ``sliding_log``, ``token_bucket``,
            ``token_bucket_debt``, ``leaky_bucket`` or ``gcra``.
    """
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigurationError(f"unknown algorithm {name!r}; choose one of: {', '.join(ALGORITHMS)}") from None
