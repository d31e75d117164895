"""Processes sharing one ``SharedMemoryStore`` never admit more than the limit in any window, for
6 s of aligned windows. A process that read the clock just before a boundary and took the table's
lock after another process began the next window used to reset that window's count: 4 processes
on ``100/s`` admitted 200, 199, 200, 199 per aligned second."""

from __future__ import annotations

import math
import multiprocessing
import time
from collections import Counter
from pathlib import Path

import pytest

from ratewarden.stores.shared_memory import SharedMemoryStore
from tests.shm import unique_name
from tests.stores import boundary_workers

PROCESSES = 4
LIMIT, PERIOD = 100, 0.5
SECONDS = 6.0
#: The table's lock timeout: the test is about exactness, not timeouts (a holder descheduled on a
#: loaded machine can keep a lock past the default 0.5 s).
LOCK_TIMEOUT = 60.0


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
def test_processes_racing_across_window_boundaries_never_exceed_the_limit(tmp_path: Path, algorithm: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    name = unique_name()
    SharedMemoryStore(name, max_keys=1000, directory=tmp_path, lock_timeout=LOCK_TIMEOUT)
    ready, go, out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(
            target=boundary_workers.loop_checks,
            args=(name, str(tmp_path), algorithm, LIMIT, PERIOD, LOCK_TIMEOUT, ready, go, out),
        )
        for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:  # every worker is up (spawned, imported, the table open) before the first window
        ready.get(timeout=300)
    first = math.floor((time.time() + 1.0) / PERIOD) + 1
    stop_at = (first + SECONDS / PERIOD) * PERIOD
    for _ in procs:
        go.put(stop_at)
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    errors = [r for r in results if isinstance(r, str)]
    assert not errors, errors
    admitted: Counter[int] = Counter()
    for counts, _ in results:  # type: ignore[misc]
        admitted.update(counts)
    windows = range(first, first + int(SECONDS / PERIOD))
    whole = {window: admitted.get(window, 0) for window in windows}
    over = {window: count for window, count in whole.items() if count > LIMIT}
    assert not over, f"windows over {LIMIT}: {over} (all: {sorted(whole.items())})"
    # Every process kept checking and the windows filled: an excess would have shown.
    assert all(checks > LIMIT for _, checks in results), results  # type: ignore[misc]
    assert sum(whole.values()) >= 0.9 * LIMIT * len(whole), sorted(whole.items())
