"""``SharedMemoryStore.hit_one``, the one-key check the middleware calls for a one-limit rule
(issue 22): the same decisions and the same stored state as ``hit_now`` with one key and as the
general multi-key path (``_hit_many``, through ``slots.charge_all``) over sequences of checks
(every algorithm, costs above 1, a late clock, a full table, every lock kind); its error paths
leave the region and the thread lock free; and concurrent processes and threads on one key admit
exactly the limit."""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ratewarden.algorithms import ALGORITHMS
from ratewarden.decision import Decision
from ratewarden.errors import ConfigurationError, StoreError
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.base import Store
from ratewarden.stores.shared_memory import SharedMemoryError, SharedMemoryStore
from ratewarden.stores.shared_memory.layout import E_DIGEST, F64, R_NEXT_EXPIRY, Region
from ratewarden.stores.shared_memory.segment import RegionLocks
from ratewarden.stores.shared_memory.table import count, entry, read
from tests.shm import NATIVE, unique_name
from tests.vectors.runner import FakeClock

ALGORITHM_NAMES = sorted(ALGORITHMS)
FROZEN = 6000.0  # the concurrency tests' clock: no refill or window change during a burst

Check = Callable[[SharedMemoryStore, str, Limit, float], Decision]


def _one(store: SharedMemoryStore, key: str, limit: Limit, cost: float) -> Decision:
    return store.hit_one(key, limit, cost)


def _now(store: SharedMemoryStore, key: str, limit: Limit, cost: float) -> Decision:
    return store.hit_now([key], [limit], [cost])


def _general(store: SharedMemoryStore, key: str, limit: Limit, cost: float) -> Decision:
    """The multi-key path with one key: locked(), charge_all, store_state (no code shared with
    the one-key check's probe, lock handling or write)."""
    seg = store._segment()
    return store._hit_many(seg, [key], [limit], [cost], store.clock())


PATHS: dict[str, Check] = {"hit_one": _one, "hit_now": _now, "general": _general}


def _decision(d: Decision) -> tuple[object, ...]:
    return (d.allowed, d.limit, d.remaining, d.reset_after, d.retry_after, d.period, d.policy)


def _stored(store: SharedMemoryStore) -> list[tuple[object, ...]]:
    """Everything a check writes: each region's entries (digest, dirty flag, expiry, state), in
    any order, and its next_expiry bound; the overflow region too."""
    seg = store._segment()
    out: list[tuple[object, ...]] = []
    regions: list[Region] = [*seg.regions, seg.overflow]
    for number, region in enumerate(regions):
        entries = []
        for pos in range(count(seg, region)):
            off = entry(seg, region, pos)
            expires, state = read(seg, off)
            entries.append((bytes(seg.mm[off + E_DIGEST : off + E_DIGEST + 16]), seg.mm[off], expires, tuple(state)))
        out.append((number, F64.unpack_from(seg.mm, region.base + R_NEXT_EXPIRY)[0], sorted(entries)))
    return out


def _store(directory: Path, lock: str, clock: Callable[[], float], max_keys: int = 1000) -> SharedMemoryStore:
    store = SharedMemoryStore(unique_name(), max_keys=max_keys, directory=directory, clock=clock, lock=lock, log_size=16)
    store.unlink()
    return store


def _work(seed: int, keys: int) -> list[tuple[float, str, int, float]]:
    """(clock, key, limit number, cost) per check: new keys, repeats, costs 1-3, clock steps
    forward, late readings (up to 0.4 s back) and jumps past every window."""
    rng = random.Random(seed)
    limits = _limits()
    now = 1_000_000.0
    work = []
    for _ in range(800):
        step = rng.random()
        if step < 0.15:
            late = now - rng.uniform(0.01, 0.4)  # a late clock: another worker's reading, behind
            work.append((late, f"k{rng.randrange(keys)}", rng.randrange(len(limits)), float(rng.choice((1, 2, 3)))))
            continue
        if step < 0.5:
            now += rng.uniform(0.0, 0.25)
        elif step < 0.52:
            now += 120.0  # past every window: states expire
        work.append((now, f"k{rng.randrange(keys)}", rng.randrange(len(limits)), float(rng.choice((1, 1, 2, 3)))))
    return work


def _limits() -> list[Limit]:
    return [Limit(Rate(n, period), a) for a in ALGORITHM_NAMES for n, period in ((3, 1.0), (7, 10.0))]


def _replay(store: SharedMemoryStore, clock: FakeClock, check: Check, work: list[tuple[float, str, int, float]]) -> list[tuple[object, ...]]:
    limits = _limits()
    out = []
    for now, key, n, cost in work:
        clock.now = now
        limit = limits[n]
        out.append(_decision(check(store, f"rw:{{{key}}}:{limit.suffix}", limit, cost)))
    return out


@pytest.mark.parametrize(("max_keys", "keys"), [(1000, 3), (8, 40)], ids=["roomy", "full"])
def test_hit_one_decides_and_stores_as_hit_now_and_the_general_path(
    tmp_path: Path, lock: str, max_keys: int, keys: int
) -> None:
    """The same checks on three fresh tables, one per path: identical decisions after every check,
    identical tables at the end (a full table: identical overflow charges too)."""
    for seed in range(3):
        work = _work(seed, keys)
        decisions, tables, overflowed = {}, {}, {}
        for name, check in PATHS.items():
            clock = FakeClock()
            store = _store(tmp_path, lock, clock, max_keys)
            assert (store._segment().native is not None) == (NATIVE and lock == "mutex" and _native_on())
            decisions[name] = _replay(store, clock, check, work)
            tables[name] = _stored(store)
            overflowed[name] = store.overflowed
        assert any(d[0] for d in decisions["hit_one"]) and not all(d[0] for d in decisions["hit_one"])
        for name in ("hit_now", "general"):
            assert decisions[name] == decisions["hit_one"], f"{name} (seed {seed}) decided differently"
            assert tables[name] == tables["hit_one"], f"{name} (seed {seed}) stored differently"
            assert overflowed[name] == overflowed["hit_one"]
        if max_keys < keys:
            assert overflowed["hit_one"] > 0  # the table-full path ran


def _native_on() -> bool:
    import os

    return os.environ.get("RATEWARDEN_SHM_NATIVE", "1") != "0"


def test_hit_one_interleaved_with_hit_now_on_one_table(tmp_path: Path, lock: str) -> None:
    """Both entries on one table, alternating per check, match a table driven by hit_now alone."""
    work = _work(7, 10)
    results = []
    for mixed in (False, True):
        clock = FakeClock()
        store = _store(tmp_path, lock, clock)
        limits = _limits()
        out = []
        for i, (now, key, n, cost) in enumerate(work):
            clock.now = now
            check = _one if mixed and i % 2 else _now
            out.append(_decision(check(store, f"rw:{{{key}}}:{limits[n].suffix}", limits[n], cost)))
        results.append((out, _stored(store)))
    assert results[0] == results[1]


def test_hit_one_is_the_stores_own(tmp_path: Path) -> None:
    """Not the Store default (which builds three tuples and goes through hit_now)."""
    assert SharedMemoryStore.hit_one is not Store.hit_one
    assert "hit_one" in vars(SharedMemoryStore)


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window"])
def test_a_late_clock_never_moves_an_expiry_earlier(tmp_path: Path, lock: str, algorithm: str) -> None:
    """A check in window 1001 of 100/s (expiry 1002 or later), then one whose clock reads late, in
    window 1000: the entry keeps its expiry (the late caller's now + reset_after is earlier), as on
    the general path (test_shared_memory_defects)."""
    clock = FakeClock(1001.001)
    limit = Limit(Rate(100, 1.0), algorithm)
    stores = {name: _store(tmp_path, lock, clock) for name in PATHS}
    for now in (1001.001, 1000.9995, 1001.5, 1001.9998):
        clock.now = now
        decided = {name: _decision(check(stores[name], "k", limit, 1.0)) for name, check in PATHS.items()}
        assert decided["hit_one"] == decided["hit_now"] == decided["general"]
        assert _stored(stores["hit_one"]) == _stored(stores["hit_now"]) == _stored(stores["general"])
    expiry = [e[2] for _, _, entries in _stored(stores["hit_one"]) for e in entries]
    assert expiry and all(e >= 1002.0 for e in expiry)
    assert decided["hit_one"][2] == 96  # window 1001's count outlived the late caller's idea of it


# --- errors ----------------------------------------------------------------------------------------


class _Refusing(RegionLocks):
    """The table's own locks, but the next ``lock`` fails: an ``OSError`` (a kernel refusing an
    ``fcntl`` lock), or a mutex error code (not ``EOWNERDEAD``: the lock is not held)."""

    def __init__(self, inner: RegionLocks, failure: BaseException | int) -> None:
        self.inner = inner
        self.mutex = inner.mutex
        self.failure: BaseException | int | None = failure

    def lock(self, region: Region, timeout: float) -> int:
        failure, self.failure = self.failure, None
        if isinstance(failure, BaseException):
            raise failure
        if failure is not None:
            return failure
        return self.inner.lock(region, timeout)

    def unlock(self, region: Region) -> None:
        self.inner.unlock(region)

    def consistent(self, region: Region) -> int:
        return self.inner.consistent(region)


def _finishes(check: Callable[[], object]) -> None:
    """Run ``check`` in another thread: it must not wait for a lock the failure left held."""
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(check()), daemon=True)
    worker.start()
    worker.join(20)
    assert done, "the region (or the thread lock) was left locked"


@pytest.mark.parametrize("failure", [OSError(35, "Resource deadlock avoided"), 22], ids=["oserror", "rc"])
def test_a_refused_lock_leaves_nothing_held(
    tmp_path: Path, lock: str, failure: BaseException | int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path of the Python locks (fcntl, ctypes mutexes; the C helpers lock in ``begin``)."""
    monkeypatch.setenv("RATEWARDEN_SHM_NATIVE", "0")
    store = _store(tmp_path, lock, FakeClock(1000.0))
    limit = Limit(Rate(3, 60.0), "token_bucket")
    assert store.hit_one("k", limit, 1.0).remaining == 2
    seg = store._segment()
    seg.locks = _Refusing(seg.locks, failure)
    expected = OSError if isinstance(failure, OSError) else SharedMemoryError
    with pytest.raises(expected):
        store.hit_one("k", limit, 1.0)
    assert not seg.tlock.locked()
    _finishes(lambda: store.hit_one("k", limit, 1.0))
    assert store.hit_one("k", limit, 1.0).remaining == 0  # the failed check charged nothing


async def test_a_refused_lock_is_a_store_error_through_hit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATEWARDEN_SHM_NATIVE", "0")
    store = _store(tmp_path, "lockf", FakeClock(1000.0))
    seg = store._segment()
    seg.locks = _Refusing(seg.locks, OSError(35, "Resource deadlock avoided"))
    limit = Limit(Rate(3, 60.0), "gcra")
    with pytest.raises(StoreError):
        await store.hit(["k"], [limit], [1.0])


def test_errors_match_hit_now(tmp_path: Path, lock: str) -> None:
    """A sliding log longer than the table keeps, and a closed store: the same errors, nothing held."""
    store = _store(tmp_path, lock, FakeClock(1000.0))
    big = Limit(Rate(500, 60.0), "sliding_log")
    with pytest.raises(ConfigurationError, match="log_size"):
        store.hit_one("k", big, 1.0)
    with pytest.raises(ConfigurationError, match="log_size"):
        store.hit_now(["k"], [big], [1.0])
    ok = Limit(Rate(2, 60.0), "sliding_log")
    _finishes(lambda: store.hit_one("k", ok, 1.0))
    import asyncio

    asyncio.run(store.close())
    with pytest.raises(SharedMemoryError, match="closed"):
        store.hit_one("k", ok, 1.0)
    with pytest.raises(SharedMemoryError, match="closed"):
        store.hit_now(["k"], [ok], [1.0])


# --- exactness under concurrency ---------------------------------------------------------------------


def frozen() -> float:
    return FROZEN


def burst(name: str, directory: str, lock: str, threads: int, checks: int, barrier: Any, out: Any) -> None:
    """``threads`` threads x ``checks`` hit_one calls per algorithm on one key (limit 100); report
    the allowed counts (run in spawned processes, and in the test's own)."""
    try:
        store = SharedMemoryStore(name, max_keys=1000, directory=directory, clock=frozen, lock=lock)
        limits = {a: Limit(Rate(100, 3600.0), a) for a in ALGORITHM_NAMES}
        counts = dict.fromkeys(ALGORITHM_NAMES, 0)
        counted = threading.Lock()
        start = threading.Barrier(threads)

        def run() -> None:
            start.wait()
            for algorithm, limit in limits.items():
                key = f"rw:{{hot}}:{limit.suffix}"
                allowed = sum(store.hit_one(key, limit, 1.0).allowed for _ in range(checks))
                with counted:
                    counts[algorithm] += allowed

        if barrier is not None:
            barrier.wait()
        workers = [threading.Thread(target=run) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        out.put(counts)
    except BaseException as exc:
        out.put(f"{type(exc).__name__}: {exc}")
        raise


def test_threads_on_one_key_admit_exactly_the_limit(tmp_path: Path, lock: str) -> None:
    import queue

    name = unique_name()
    SharedMemoryStore(name, max_keys=1000, directory=tmp_path, lock=lock)
    out: queue.Queue[object] = queue.Queue()
    burst(name, str(tmp_path), lock, 8, 40, None, out)  # 320 checks per algorithm
    counts = out.get()
    assert counts == dict.fromkeys(ALGORITHM_NAMES, 100), counts


def test_processes_on_one_key_admit_exactly_the_limit(tmp_path: Path, lock: str) -> None:
    """3 spawned processes x 4 threads x 30 checks (360) per algorithm on one key limited to 100."""
    ctx = multiprocessing.get_context("spawn")
    name = unique_name()
    SharedMemoryStore(name, max_keys=1000, directory=tmp_path, lock=lock)
    barrier = ctx.Barrier(3)
    out = ctx.Queue()
    procs = [ctx.Process(target=burst, args=(name, str(tmp_path), lock, 4, 30, barrier, out)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, results
    errors = [r for r in results if isinstance(r, str)]
    assert not errors, errors
    for algorithm in ALGORITHM_NAMES:
        allowed = sum(r[algorithm] for r in results)  # type: ignore[index]
        assert allowed == 100, f"{algorithm}: {allowed} allowed of 360 against a limit of 100"

