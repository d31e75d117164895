"""Every distributed store x every algorithm, against real servers (Redis standalone, Sentinel and
Cluster, Valkey, Memcached, and the shared-memory table): vectors, exact concurrency, cross-process
exactness, and equality with the Python algorithms."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
import uuid
from typing import Any

import pytest

from ratewarden.decision import Decision
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.base import StoreError
from ratewarden.stores.memory import MemoryStore
from tests.stores.helpers import ALGORITHM_NAMES, KINDS, client_process, limit_of, make_store
from tests.vectors.runner import FakeClock, run_vectors

FIXTURES = {"redis": "redis_standalone", "valkey": "valkey_standalone", "cluster": "redis_cluster", "sentinel": "redis_sentinel",
            "memcached": "memcached_server", "shm": "shm_table"}
NO_CACHE_OPTION = ("memcached", "shm")

STALL = 0.0005  # seconds: a round trip longer than this may outlast a 1 ms state on the server


@pytest.fixture
def shm_table(tmp_path: Any) -> Any:
    """A SharedMemoryStore table, named by URL like the servers (every process opens it by name)."""

    class Table:
        url = f"shm://t{uuid.uuid4().hex[:12]}?max_keys=65536&directory={tmp_path}"

    return Table()


@pytest.fixture(params=KINDS)
def kind_url(request: pytest.FixtureRequest) -> tuple[str, str]:
    server = request.getfixturevalue(FIXTURES[request.param])
    return request.param, server.url


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "nocache"])
async def test_vectors(kind_url: tuple[str, str], cache: bool) -> None:
    kind, url = kind_url
    options: dict[str, Any] = {} if kind in NO_CACHE_OPTION else {"cache": cache}
    steps = await run_vectors(lambda clock: make_store(kind, url, clock, **options))
    assert steps > 40


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
async def test_150_concurrent_against_100(kind_url: tuple[str, str], algorithm: str) -> None:
    kind, url = kind_url
    store = make_store(kind, url)
    limit = limit_of(algorithm)
    key = f"rw:{{c150|{uuid.uuid4().hex}}}:{limit.suffix}"
    try:
        for _ in range(5):
            await store.reset([key])
            decisions = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(150)))
            allowed = sum(d.allowed for d in decisions)
            assert allowed == 100, f"{kind}/{algorithm}: {allowed} allowed"
            assert sorted(d.remaining for d in decisions if d.allowed) == list(range(100))
            assert all(d.retry_after > 0 for d in decisions if not d.allowed)
    finally:
        await store.close()


def test_ten_processes_exactly_1000_allowed(kind_url: tuple[str, str]) -> None:
    """10 processes x 120 requests per algorithm over 10 client keys limited to 100 each."""
    kind, url = kind_url
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(10)
    out = ctx.Queue()
    prefix = f"rw:mp{uuid.uuid4().hex[:8]}"
    procs = [ctx.Process(target=client_process, args=(kind, url, prefix, i, barrier, out)) for i in range(10)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    errors = [r for _, r in results if isinstance(r, str)]
    assert not errors, f"{kind}: client processes failed: {errors}"
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    for name in ALGORITHM_NAMES:
        allowed = sum(counts[name] for _, counts in results)
        assert (allowed, 1200 - allowed) == (1000, 200), f"{kind}/{name}: {allowed} allowed"


@pytest.mark.parametrize("seed", [1, 2])
async def test_same_answers_as_memory(kind_url: tuple[str, str], seed: int) -> None:
    """Random multi-limit, mixed-algorithm checks: every field equals the memory store's."""
    kind, url = kind_url
    rng = random.Random(seed)
    clock = FakeClock(1_000_000.0 + rng.random())
    remote = make_store(kind, url, clock, **({} if kind in NO_CACHE_OPTION else {"cache": False}))
    memory = MemoryStore(clock=clock)
    tag = uuid.uuid4().hex
    limits = [
        Limit(Rate(rng.randint(1, 6), rng.choice([0.5, 1.0, 2.5, 10.0]), rng.choice([None, 3])), name)
        for name in ALGORITHM_NAMES
        for _ in range(2)
    ]
    keys = [f"rw:{{eq|{tag}}}:{i}:{limit.suffix}" for i, limit in enumerate(limits)]
    try:
        for step in range(300):
            clock.advance(rng.choice([0.0, 0.01, 0.1, 0.37, 1.0, 3.0]))
            picks = rng.sample(range(len(limits)), rng.randint(1, 3))
            costs = [rng.choice([1.0, 1.0, 2.0, 0.5, 0.0]) for _ in picks]
            args = ([keys[i] for i in picks], [limits[i] for i in picks], costs)
            got = await remote.hit(*args)
            want = await memory.hit(*args)
            assert (got.allowed, got.limit, got.remaining, got.policy) == (
                want.allowed, want.limit, want.remaining, want.policy
            ), f"step {step}: {got} != {want}"
            tol = 0.0 if kind != "memcached" else 1e-9
            assert abs(got.reset_after - want.reset_after) <= tol or got.reset_after == want.reset_after, step
            assert abs(got.retry_after - want.retry_after) <= tol or got.retry_after == want.retry_after, step
        peeked = await remote.peek(keys, limits)
        assert peeked == await memory.peek(keys, limits)
    finally:
        await remote.close()


def _exactly(decision: Decision) -> tuple[Any, ...]:
    """Every field, floats bit for bit (``Decision.__eq__`` allows 1e-6)."""
    d = decision
    return (d.allowed, d.limit, d.remaining, d.reset_after.hex(), d.retry_after.hex(), d.policy)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_gcra_same_answers_as_memory_at_wall_clock_times(kind_url: tuple[str, str], seed: int) -> None:
    """GCRA counts time in whole steps of a grid (algorithms/gcra.py); the Redis script must give
    the same answers: slow and very fast rates, bursts, fractional and refunded costs, at today's
    clock, across 2**31 s (where the grid doubles) and near 2**33 s."""
    kind, url = kind_url
    rng = random.Random(seed)
    base = [1_800_000_000.0, 2.0**31 - 20.0, 2.0**33 - 50.0][seed - 1] + rng.random()
    clock = FakeClock(base)
    remote = make_store(kind, url, clock, **({} if kind in NO_CACHE_OPTION else {"cache": False}))
    memory = MemoryStore(clock=clock)
    tag = uuid.uuid4().hex
    rates = [(7, 3600.0, None), (10_000, 1.0, None), (100_000, 1.0, 1000), (6, 60.0, 10), (1, 0.2, None), (3, 10.0, 2)]
    limits = [Limit(Rate(amount, period, burst), "gcra", f"g{i}") for i, (amount, period, burst) in enumerate(rates)]
    keys = [f"rw:{{gcra|{tag}}}:{i}:{limit.suffix}" for i, limit in enumerate(limits)]
    adjust = remote.supports("adjust")
    # The clock runs three times as fast as real time: a server expires a key reset_after real
    # seconds (at least 1 ms) after writing it, which must not come before the state has run out
    # on this clock, even with the time between reading the clock and the server's answer.
    started, skipped, stalls = time.monotonic(), 0.0, 0
    try:
        for step in range(400):
            skipped += rng.choice([0.0, 0.0, 0.0, 1e-6, 1e-5, 1e-3, 0.05, 0.37, 1.5])
            clock.now = base + skipped + 3 * (time.monotonic() - started)
            picks = rng.sample(range(len(limits)), rng.choice([1, 1, 1, 2]))
            costs = [rng.choice([1.0, 1.0, 1.0, 3.0, 0.5, 0.0, 400.0]) for _ in picks]
            args = ([keys[i] for i in picks], [limits[i] for i in picks], costs)
            read_at = time.monotonic()
            if adjust and step % 7 == 0:
                amounts = [rng.choice([-2.0, -0.5, 1.0, 5.0]) for _ in picks]
                got_all = await remote.adjust(args[0], args[1], amounts)
                want_all = await memory.adjust(args[0], args[1], amounts)
                got, want = list(map(_exactly, got_all)), list(map(_exactly, want_all))
            else:
                got, want = _exactly(await remote.hit(*args)), _exactly(await memory.hit(*args))
            if got != want and time.monotonic() - read_at > STALL:
                # The process stalled between reading the clock and the server's answer (a busy
                # machine) long enough for the server to expire a state of a millisecond that has
                # not run out on the frozen clock: start those keys over in both, and count it.
                stalls += 1
                await remote.reset(args[0])
                await memory.reset(args[0])
                continue
            assert got == want, f"step {step} at {clock.now!r}: {got} != {want}"
        assert stalls <= 20, f"{stalls} of 400 steps stalled past {STALL} s"
        clock.now = base + skipped + 3 * (time.monotonic() - started)
        peeked = await remote.peek(keys, limits)
        assert list(map(_exactly, peeked)) == list(map(_exactly, await memory.peek(keys, limits)))
    finally:
        await remote.close()


async def test_reset_forgets_state(kind_url: tuple[str, str]) -> None:
    kind, url = kind_url
    store = make_store(kind, url)
    limit = limit_of("fixed_window", amount=2)
    keys = [f"rw:{{reset|{uuid.uuid4().hex}}}:{limit.suffix}", f"rw:{{other|{uuid.uuid4().hex}}}:{limit.suffix}"]
    try:
        for _ in range(2):
            assert (await store.hit(keys, [limit, limit], [1.0, 1.0])).allowed
        assert not (await store.hit(keys, [limit, limit], [1.0, 1.0])).allowed
        await store.reset(keys)
        decision = await store.hit(keys, [limit, limit], [1.0, 1.0])
        assert decision.allowed and decision.remaining == 1
    finally:
        await store.close()


async def test_all_or_nothing_across_keys(kind_url: tuple[str, str]) -> None:
    """A denial by one limit charges none of the others, also across cluster hash slots."""
    kind, url = kind_url
    store = make_store(kind, url)
    wide, narrow = limit_of("token_bucket", amount=10), limit_of("sliding_log", amount=1)
    keys = [f"rw:{{a|{uuid.uuid4().hex}}}:{wide.suffix}", f"rw:{{b|{uuid.uuid4().hex}}}:{narrow.suffix}"]
    try:
        assert (await store.hit(keys, [wide, narrow], [1.0, 1.0])).allowed
        for _ in range(5):
            denied = await store.hit(keys, [wide, narrow], [1.0, 1.0])
            assert not denied.allowed and denied.limit == 1
        left = await store.peek(keys[:1], [wide])
        assert left[0].remaining == 9  # only the first, allowed, check was charged
    finally:
        await store.close()


async def test_unreachable_store_raises_store_error_naming_url(kind_url: tuple[str, str]) -> None:
    kind, _ = kind_url
    if kind == "shm":
        pytest.skip("a shared-memory table has no server to be unreachable (its file errors: test_shared_memory.py)")
    from tests.servers import free_port

    port = free_port()
    url = {
        "redis": f"redis://:secret@127.0.0.1:{port}/0",
        "valkey": f"valkey://:secret@127.0.0.1:{port}/0",
        "cluster": f"redis+cluster://127.0.0.1:{port}",
        "sentinel": f"redis+sentinel://127.0.0.1:{port}/mymaster",
        "memcached": f"memcached://127.0.0.1:{port}",
    }[kind]
    limit = limit_of("gcra")
    with pytest.raises(StoreError) as info:
        store = make_store(kind, url, timeout=0.5)
        await store.hit(["rw:{x|y}:z"], [limit], [1.0])
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "secret" not in str(info.value)


async def test_cluster_burst_right_after_script_flush(redis_cluster: Any) -> None:
    """A burst of 840 concurrent checks on nodes that lost the script (restart, failover): the
    NOSCRIPT retry must not open one connection per check and exhaust the nodes' pools."""
    from tests.servers import redis_cmd

    for port in redis_cluster.ports:
        redis_cmd(port, "SCRIPT", "FLUSH")
    store = make_store("cluster", redis_cluster.url)
    prefix = f"rw:flush{uuid.uuid4().hex[:8]}"
    limits = {name: limit_of(name) for name in ALGORITHM_NAMES}
    try:
        decisions = await asyncio.gather(
            *(
                store.hit([f"{prefix}:{{client{j % 10}}}:{limits[name].suffix}"], [limits[name]], [1.0])
                for name in ALGORITHM_NAMES
                for j in range(120)
            )
        )
    finally:
        await store.close()
    assert sum(d.allowed for d in decisions) == 840  # 12 per key, far below 100
