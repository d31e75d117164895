"""Processes racing across window boundaries on one ``SharedMemoryStore`` (importable after
``spawn``): each loops checks until ``stop_at`` and reports its admissions by charged window."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.shared_memory import SharedMemoryStore
from tests.core.test_window_boundaries import charged_window

_reading = [0.0]


def _clock() -> float:
    _reading[0] = now = time.time()
    return now


def loop_checks(name: str, directory: str, algorithm: str, limit: int, period: float, lock_timeout: float, ready: Any, go: Any, out: Any) -> None:
    """Open the table, say so on ``ready``, then check until the ``stop_at`` read from ``go``."""
    try:
        store = SharedMemoryStore(name, max_keys=1000, directory=directory, clock=_clock, lock_timeout=lock_timeout)
        checked = Limit(Rate(limit, period), algorithm)
        key = f"rw:{{boundary}}:{checked.suffix}"
        admitted: Counter[int] = Counter()
        checks = 0
        ready.put(None)
        stop_at: float = go.get(timeout=300)
        while time.time() < stop_at:
            decision = store.hit_now([key], [checked], [1.0])
            checks += 1
            if decision.allowed:
                admitted[charged_window(_reading[0], decision.reset_after, period)] += 1
        out.put((dict(admitted), checks))
    except BaseException as exc:
        out.put(f"{type(exc).__name__}: {exc}")
        raise
