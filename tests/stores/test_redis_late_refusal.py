"""A script that refuses to run past its deadline ("expired") charged nothing. While its caller
still waits (a busy loop wrote it late: seen on Cluster under a flood, where redis-py writes to
each node from a task of its own), it is sent again with a fresh deadline instead of failing the
check, which the insurance limiter would then admit on top of the store's limit."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from ratewarden.errors import StoreError
from ratewarden.limits import make_limits
from ratewarden.stores.redis import RedisStore
from ratewarden.stores.redis.clock import ScriptClock
from ratewarden.stores.redis.errors import RESENDS


class _LateClock(ScriptClock):
    """The store's clock, giving its next ``_LATE[id]`` deadlines 10 s in the past."""

    __slots__ = ()

    def deadline(self, wall_due: float, strict: bool = False) -> str:
        asked = _ASKED[id(self)] = _ASKED.get(id(self), 0) + 1
        return super().deadline(wall_due - 10 if asked <= _LATE[id(self)] else wall_due, strict)


_LATE: dict[int, int] = {}
_ASKED: dict[int, int] = {}


def _late_deadlines(store: RedisStore, late: int) -> Callable[[], int]:
    """The store's next ``late`` deadlines lie 10 s in the past (its scripts refuse them); the
    returned function counts the deadlines asked for since."""
    clock = store._script_clock
    _LATE[id(clock)] = late
    _ASKED[id(clock)] = 0
    clock.__class__ = _LateClock
    return lambda: _ASKED[id(clock)]


async def _warm(store: RedisStore, key: str) -> None:
    """Connect and measure the server clock, so that the next scripts carry real deadlines."""
    (limit,) = make_limits("1000/hour")
    await store.hit([key + ":warm"], [limit], [1.0])


@pytest.mark.parametrize("server", ["redis_standalone", "redis_cluster"])
async def test_a_check_refused_as_late_is_sent_again_and_charged_once(request: pytest.FixtureRequest, server: str) -> None:
    store = RedisStore(request.getfixturevalue(server).url)
    (limit,) = make_limits("5/hour")
    key = f"rw:{{late|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        await _warm(store, key)
        asked = _late_deadlines(store, late=RESENDS)
        decision = await store.hit([key], [limit], [1.0])
        assert asked() >= RESENDS + 1  # refused RESENDS times (a busy loop re-dates more), then run on time
        assert decision.allowed and decision.remaining == 4  # charged once, not once per send
        (peeked,) = await store.peek([key], [limit])
        assert peeked.remaining == 4
    finally:
        await store.close()


async def test_checks_on_several_slots_refused_as_late_are_sent_again(redis_cluster: object) -> None:
    """The uncoalesced path (one script call per slot) resends the same way."""
    store = RedisStore(redis_cluster.url)  # type: ignore[attr-defined]
    limits = make_limits("5/hour") + make_limits("7/hour")
    keys = [f"rw:{{a{uuid.uuid4().hex}}}:{limits[0].suffix}", f"rw:{{b{uuid.uuid4().hex}}}:{limits[1].suffix}"]
    try:
        await _warm(store, keys[0])
        _late_deadlines(store, late=1)
        decision = await store.hit(keys, list(limits), [1.0, 1.0])
        assert decision.allowed
        peeked = await store.peek(keys, list(limits))
        assert [d.remaining for d in peeked] == [4, 6]
    finally:
        await store.close()


async def test_a_check_refused_as_late_every_time_fails_and_charges_nothing(redis_standalone: object) -> None:
    store = RedisStore(redis_standalone.url)  # type: ignore[attr-defined]
    (limit,) = make_limits("5/hour")
    key = f"rw:{{late|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        await _warm(store, key)
        clock = store._script_clock
        _late_deadlines(store, late=10**9)  # every deadline, a batch re-dated on a busy loop's too
        with pytest.raises(StoreError, match="expired"):
            await store.hit([key], [limit], [1.0])
        _LATE[id(clock)] = 0
        (peeked,) = await store.peek([key], [limit])
        assert peeked.remaining == 5
    finally:
        await store.close()
