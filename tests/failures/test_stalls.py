"""A stalled process is not a busy loop: a Cluster pipeline (whose connections are redis-py's, so
no arrivals tell whether the node answers) whose timer fires a few ms late, the loop otherwise
idle, still fails a silent node's checks within the documented 2 x timeout.

CI failed ``test_cell[policy-charge-cluster-paused-open]`` with every fault request answered after
1.04 s against a bound of 0.9 s: on a loaded machine the timer fired 2-23 ms late at each expiry
(the process descheduled; one loop pass took 0.1 ms), and each late firing re-armed it for a
whole timeout (0.2 s), four times, until redis-py's own 1 s socket timeout ended the pipeline
("Timeout reading from ..."). Reproduced with ``-k cluster-paused`` and one CPU burner: 4 of 16
cells failed, 1.005-1.41 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ratewarden.errors import StoreError
from ratewarden.limits import make_limits
from ratewarden.stores.redis import pipeline as pipeline_module
from ratewarden.stores.redis.clock import ScriptClock
from ratewarden.stores.redis.pipeline import Exchange, Pipeline
from ratewarden.stores.redis.protocol import ScriptArgs
from tests.timing import Stopwatch

TIMEOUT = 0.2  # the failure matrix's Cluster timeout
STALL = 0.006  # the process descheduled just as the timer is due (2-23 ms seen in CI)


def cluster_pipeline(execute: Callable[[list[Any], Exchange], Awaitable[list[Any]]]) -> Pipeline:
    clock = ScriptClock(TIMEOUT, lambda: 1000.0)
    return Pipeline(
        url="redis+cluster://127.0.0.1:1", timeout=TIMEOUT, pool_size=8, clock=clock, encoding=ScriptArgs(lambda: 1000.0),
        execute=execute, prepare=lambda: asyncio.sleep(0), late_writes=True,
    )


@pytest.fixture
def stalled_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every expiry of a pipeline's timer runs ``STALL`` late, the loop itself idle."""
    expire = Pipeline._expire

    def late(self: Pipeline, batch: Any) -> None:
        time.sleep(STALL)
        expire(self, batch)

    monkeypatch.setattr(Pipeline, "_expire", late)


async def _checks(pipeline: Pipeline, n: int = 3) -> tuple[list[Any], Stopwatch]:
    (limit,) = make_limits("3/hour", "gcra")
    with Stopwatch() as clock:
        results = await asyncio.gather(
            *(pipeline.request("h", ["rw:{a}:x"], [limit], [1.0]) for _ in range(n)), return_exceptions=True
        )
    return results, clock


async def test_a_silent_cluster_node_fails_checks_within_two_timeouts_when_every_timer_fires_late(
    stalled_timers: None,
) -> None:
    async def silent(requests: list[Any], exchange: Exchange) -> list[Any]:
        exchange.fresh(requests)
        exchange.sent(None)  # as ClusterConnections: written, arrivals unknown
        await asyncio.Event().wait()  # the node is paused
        raise AssertionError("unreachable")

    results, clock = await _checks(cluster_pipeline(silent))
    assert all(isinstance(r, StoreError) and "no reply" in str(r) for r in results), results
    # Re-armed a whole timeout at each late firing, the checks failed after 5 timeouts (1.03 s).
    assert clock.within(2 * TIMEOUT + 0.15), clock


async def test_a_reply_received_during_a_stall_still_reaches_its_caller(stalled_timers: None) -> None:
    """The short re-arm leaves a received reply the loop passes it needs: no false timeout."""

    async def late_reply(requests: list[Any], exchange: Exchange) -> list[Any]:
        exchange.fresh(requests)
        exchange.sent(None)
        await asyncio.sleep(TIMEOUT + STALL / 2)  # arrives while the process is stalled at the expiry
        return [[1, 3, 2, 0.0, 1200.0, 0] for _ in requests]

    results, _ = await _checks(cluster_pipeline(late_reply))
    assert all(isinstance(r, list) for r in results), results


async def test_a_busy_loop_still_rearms_a_whole_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop whose every pass is long (here longer than the timeout) waits a whole timeout per
    re-arm, as before: the reply, which needs several of those passes, arrives."""
    monkeypatch.setattr(pipeline_module, "_MAX_EXTENSIONS", 4)
    stop = False

    async def hog() -> None:
        while not stop:
            time.sleep(TIMEOUT / 2)
            await asyncio.sleep(0)

    async def slow_passes(requests: list[Any], exchange: Exchange) -> list[Any]:
        exchange.fresh(requests)
        exchange.sent(None)
        for _ in range(4):  # passes redis-py's cluster pipeline takes to read a reply
            await asyncio.sleep(0)
        return [[1, 3, 2, 0.0, 1200.0, 0] for _ in requests]

    hogging = asyncio.ensure_future(hog())
    await asyncio.sleep(0)
    try:
        results, _ = await _checks(cluster_pipeline(slow_passes))
    finally:
        stop = True
        await hogging
    assert all(isinstance(r, list) for r in results), results
