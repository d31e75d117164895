"""A store's ``close`` releases every socket it opened, on every topology: nothing is left for
the garbage collector to find (an unclosed socket is a ``ResourceWarning`` there, which the
suite turns into an error wherever it happens to surface)."""

from __future__ import annotations

import asyncio
import gc
import uuid
import warnings
from typing import Any

import pytest

from ratewarden.limits import make_limits
from tests.stores.helpers import make_store

FIXTURES = {"redis": "redis_standalone", "sentinel": "redis_sentinel", "cluster": "redis_cluster",
            "memcached": "memcached_server"}
CASES = [(kind, coalesce) for kind in FIXTURES for coalesce in ((True, False) if kind != "memcached" else (None,))]


async def _use(kind: str, url: str, coalesce: bool | None) -> None:
    """Open a store, make it open several connections (24 concurrent checks on keys in several
    slots), a peek, an adjust, a reset, a clear, and close it."""
    options: dict[str, Any] = {} if coalesce is None else {"coalesce": coalesce}
    prefix = f"rwclose{uuid.uuid4().hex[:8]}"  # clear deletes these keys only
    store = make_store(kind, url, **options, **({} if kind == "memcached" else {"prefix": prefix}))
    limits = make_limits("50/minute", "sliding_window")
    keys = [f"{prefix}:{{close{i}}}:{limits[0].suffix}" for i in range(8)]
    try:
        decisions = await asyncio.gather(*(store.hit([key], limits, [1.0]) for key in keys for _ in range(3)))
        assert all(d.allowed for d in decisions)
        await store.peek(keys[:3], limits * 3)  # keys in several slots of a cluster
        await store.adjust(keys[:2], limits * 2, [-1.0, -1.0])
        await store.reset(keys)
        if kind != "memcached":  # memcached's clear empties the whole shared server
            await store.clear()
    finally:
        await store.close()


@pytest.mark.parametrize(("kind", "coalesce"), CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_close_leaves_no_socket_open(request: pytest.FixtureRequest, kind: str, coalesce: bool | None) -> None:
    url = request.getfixturevalue(FIXTURES[kind]).url
    gc.collect()  # what earlier tests left is theirs, not this one's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(_use(kind, url, coalesce))  # its own loop, closed here: nothing can hide in it
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, f"{kind}: {len(leaks)} left open after close: {leaks[:5]}"


async def _close_during_checks(kind: str, url: str, coalesce: bool | None) -> None:
    """Close a store while checks are in flight on it, then check once more: the checks may
    fail, but leave nothing open."""
    options: dict[str, Any] = {} if coalesce is None else {"coalesce": coalesce}
    store = make_store(kind, url, **options)
    limits = make_limits("50/minute", "sliding_window")
    keys = [f"rw:{{inflight{i}|{uuid.uuid4().hex}}}:{limits[0].suffix}" for i in range(8)]
    await store.hit(keys[:1], limits, [1.0])  # connected: the next checks are sent at once
    checks = asyncio.gather(*(store.hit([key], limits, [1.0]) for key in keys * 3), return_exceptions=True)
    await asyncio.sleep(0.001)  # the checks are written, their replies not all read
    await store.close()
    await checks
    assert (await store.hit(keys[:1], limits, [1.0])).limit == 50  # a closed store still answers


@pytest.mark.parametrize(("kind", "coalesce"), CASES, ids=[f"{k}-{c}" for k, c in CASES])
def test_close_during_checks_and_checks_after_leave_no_socket_open(
    request: pytest.FixtureRequest, kind: str, coalesce: bool | None
) -> None:
    url = request.getfixturevalue(FIXTURES[kind]).url
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(_close_during_checks(kind, url, coalesce))
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, f"{kind}: {len(leaks)} left open after close: {leaks[:5]}"
