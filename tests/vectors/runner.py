"""The shared algorithm vectors (``algorithms.json``), runnable against any store.

Each vector is a time-stepped sequence of hits on one key with the decision expected at every
step; ``retry_after: null`` in the JSON means "never" (``math.inf``). Time may go back: a
"reordered check" reads the clock before another check that reaches the store first, a "stale
clock" steps back for a while; either way state only moves forward. A clock stepped back by
more than a period (an hour ahead, then corrected) drops the state: the key counts from now. A
step with ``"repeat": n`` is the same hit made ``n`` times in a row (a burst of single requests
at one instant): each must be ``allowed`` as given, and the last one is checked in full. Every store must pass them:
the memory store in ``tests/core``, the Redis and Memcached stores in ``tests/stores``.

Usage (async test)::

    from tests.vectors.runner import run_vectors

    async def test_vectors() -> None:
        await run_vectors(lambda clock: MemoryStore(clock=clock))

``make_store(clock)`` must return a fresh ``Store`` whose notion of "now" is ``clock()`` (seconds,
a float). It is called once per vector; the runner closes that store when the vector is done, so
a factory may open a new client each time. Each vector uses its own random key, so a shared server
needs no flushing between vectors.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from ratewarden.decision import Decision
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.base import Store

__all__ = ["VECTORS_FILE", "FakeClock", "load_vectors", "run_vector", "run_vectors"]

VECTORS_FILE = Path(__file__).with_name("algorithms.json")

StoreFactory = Callable[[Callable[[], float]], "Store | Awaitable[Store]"]


class FakeClock:
    """A settable clock: ``clock()`` returns ``clock.now``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def load_vectors() -> list[dict[str, Any]]:
    """The vectors from ``algorithms.json``."""
    vectors: list[dict[str, Any]] = json.loads(VECTORS_FILE.read_text())
    return vectors


def _limit_of(vector: dict[str, Any]) -> Limit:
    spec = vector["rate"]
    rate = Rate(int(spec["limit"]), float(spec["period"]), spec.get("burst"), spec.get("debt"))
    return Limit(rate, vector["algorithm"], name=vector["name"])


def _close(expected: float, actual: float, tolerance: float) -> bool:
    if math.isinf(expected) or math.isinf(actual):
        return expected == actual
    return math.isclose(expected, actual, abs_tol=tolerance)


async def run_vector(make_store: StoreFactory, vector: dict[str, Any], tolerance: float = 1e-6) -> None:
    """Run one vector on a fresh store; raise ``AssertionError`` naming the first wrong step."""
    clock = FakeClock()
    made = make_store(clock)
    store: Store = await made if isinstance(made, Awaitable) else made
    limit = _limit_of(vector)
    key = f"rw:{{vectors|{uuid.uuid4().hex}}}:{limit.suffix}"
    decision: Decision
    try:
        for index, step in enumerate(vector["steps"]):
            clock.now = float(step["t"])
            for repeat in range(int(step.get("repeat", 1)) - 1):
                decision = await store.hit([key], [limit], [float(step["cost"])])
                if decision.allowed != step["allowed"]:
                    raise AssertionError(
                        f"vector {vector['name']!r} step {index} (t={step['t']}, cost={step['cost']}) hit {repeat} "
                        f"of {step['repeat']} on {type(store).__name__}: allowed: expected {step['allowed']!r}, "
                        f"got {decision.allowed!r} ({decision})"
                    )
            decision = await store.hit([key], [limit], [float(step["cost"])])
            expected_retry = math.inf if step["retry_after"] is None else float(step["retry_after"])
            problems: Sequence[str] = [
                f"{name}: expected {want!r}, got {got!r}"
                for name, want, got, ok in (
                    ("allowed", step["allowed"], decision.allowed, decision.allowed == step["allowed"]),
                    ("remaining", step["remaining"], decision.remaining, decision.remaining == step["remaining"]),
                    (
                        "reset_after",
                        step["reset_after"],
                        decision.reset_after,
                        _close(float(step["reset_after"]), decision.reset_after, tolerance),
                    ),
                    (
                        "retry_after",
                        expected_retry,
                        decision.retry_after,
                        _close(expected_retry, decision.retry_after, tolerance),
                    ),
                )
                if not ok
            ]
            if problems:
                raise AssertionError(
                    f"vector {vector['name']!r} step {index} (t={step['t']}, cost={step['cost']}) "
                    f"on {type(store).__name__}: " + "; ".join(problems)
                )
    finally:
        await store.close()


async def run_vectors(
    make_store: StoreFactory, vectors: Sequence[dict[str, Any]] | None = None, tolerance: float = 1e-6
) -> int:
    """Run every vector (default: all of ``algorithms.json``); return the number of steps checked.

    ``make_store(clock)`` returns a fresh store (or an awaitable of one) reading time from
    ``clock``; ``tolerance`` is the absolute slack allowed on ``reset_after``/``retry_after``
    (a store keeping state as milliseconds may need ``1e-3``).
    """
    chosen = load_vectors() if vectors is None else vectors
    steps = 0
    for vector in chosen:
        await run_vector(make_store, vector, tolerance)
        steps += len(vector["steps"])
    return steps
