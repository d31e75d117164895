"""The seven algorithms, each a pure function of (state, now, cost, rate)."""

from __future__ import annotations

import difflib
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

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmName", "State", "algorithm_name", "get_algorithm", "suggest_algorithm", "unknown_algorithm"]

AlgorithmName = Literal[
    "fixed_window", "sliding_window", "sliding_log", "token_bucket", "token_bucket_debt", "leaky_bucket", "gcra"
]
"""The algorithms by name (the ``algorithm=`` option everywhere; see the table in docs/limits.md)."""

ALGORITHMS: dict[str, Algorithm] = {
    "fixed_window": fixed_window,
    "sliding_window": sliding_window,
    "sliding_log": sliding_log,
    "token_bucket": token_bucket,
    "token_bucket_debt": token_bucket_debt,
    "leaky_bucket": leaky_bucket,
    "gcra": gcra,
}


# The names other limiters give these algorithms (flask-limiter and limits: "moving-window" is an
# exact log, "sliding-window-counter" the weighted counter).
_OTHER_NAMES: dict[str, str] = {
    "moving_window": "sliding_log",
    "sliding_window_counter": "sliding_window",
    "sliding_window_log": "sliding_log",
    "leaky": "leaky_bucket",
    "token": "token_bucket",
}


def suggest_algorithm(name: str) -> str | None:
    """The algorithm ``name`` most likely means (``"token-bucket"``: ``token_bucket``;
    flask-limiter's ``"moving-window"``: ``sliding_log``), or ``None``.

    Args:
        name: A name that is not an algorithm's.
    """
    spelled = "_".join(name.strip().lower().replace("-", " ").replace("_", " ").split())
    if spelled in ALGORITHMS:
        return spelled
    if spelled in _OTHER_NAMES:
        return _OTHER_NAMES[spelled]
    close = difflib.get_close_matches(spelled, [*ALGORITHMS, *_OTHER_NAMES], n=1, cutoff=0.75)
    return _OTHER_NAMES.get(close[0], close[0]) if close else None


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
    except (KeyError, TypeError):
        pass
    raise ConfigurationError(unknown_algorithm(name))


def unknown_algorithm(name: object) -> str:
    """The message for an unknown algorithm name: the likely one, then every valid name.

    Args:
        name: The name given.
    """
    hint = suggest_algorithm(name) if isinstance(name, str) else None
    guess = f"did you mean {hint!r}? " if hint else ""
    return f"unknown algorithm {name!r}; {guess}choose one of: {', '.join(ALGORITHMS)}"
