"""Code run in other processes by the shared-memory store tests (importable after ``spawn``)."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

from ratewarden.algorithms import ALGORITHMS
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.shared_memory import SharedMemoryStore
from tests.timing import Stopwatch
from tests.vectors.runner import FakeClock

ALGORITHM_NAMES = sorted(ALGORITHMS)
FROZEN = 6000.0  # a frozen clock: no refill or window change while a burst runs


def frozen() -> float:
    return FROZEN


def hot_key_burst(name: str, directory: str, barrier: Any, out: Any) -> None:
    """150 concurrent checks per algorithm on one key limited to 100; report the allowed counts."""

    async def main() -> dict[str, int]:
        store = SharedMemoryStore(name, max_keys=1000, directory=directory, clock=frozen)
        limits = {a: Limit(Rate(100, 3600.0), a) for a in ALGORITHM_NAMES}
        barrier.wait()
        counts = {}
        for algorithm, limit in limits.items():
            key = f"rw:{{hot}}:{limit.suffix}"
            decisions = await asyncio.gather(*(store.hit([key], [limit], [1.0]) for _ in range(150)))
            counts[algorithm] = sum(d.allowed for d in decisions)
        await store.close()
        return counts

    try:
        out.put(asyncio.run(main()))
    except BaseException as exc:
        out.put(f"{type(exc).__name__}: {exc}")
        raise


TICKS = 60


def sequence_for(index: int, keys: int) -> list[tuple[str, int, float]]:
    """Process ``index``'s deterministic work: (key, limit number, cost) per check."""
    rng = random.Random(index)
    work = []
    for i in range(keys):
        key = f"rw:{{p{index}|k{i}}}"
        for _ in range(rng.choice((1, 2))):
            work.append((key, rng.randrange(len(mixed_limits())), rng.choice((1.0, 1.0, 2.0))))
    rng.shuffle(work)
    return work


def mixed_limits() -> list[Limit]:
    return [Limit(Rate(limit, period), a) for a in ALGORITHM_NAMES for limit, period in ((2, 1.0), (3, 30.0))]


def replay(store: Any, clock: FakeClock, work: list[tuple[str, int, float]], barrier: Any = None) -> list[tuple[bool, int, float, float]]:
    """Run ``work`` in ``TICKS`` steps of the clock. Every process reads the same time: with a
    barrier, no process enters a tick before all have finished the previous one (a process whose
    clock ran ahead would rightly reclaim states another one still considers live)."""
    limits = mixed_limits()
    out = []
    tick = -1
    for j, (key, n, cost) in enumerate(work):
        now_tick = j * TICKS // len(work)
        if now_tick != tick:
            tick = now_tick
            if barrier is not None:
                barrier.wait()
            clock.now = 1_000_000.0 + tick * 0.7
        limit = limits[n]
        d = store.hit_now([f"{key}:{limit.suffix}"], [limit], [cost])
        out.append((d.allowed, d.remaining, d.reset_after, d.retry_after))
    return out


def distinct_keys(name: str, directory: str, index: int, keys: int, barrier: Any, out: Any) -> None:
    """Replay this process's sequence on the shared table; report every decision."""
    try:
        clock = FakeClock(1_000_000.0)
        store = SharedMemoryStore(name, max_keys=65_536, directory=directory, clock=clock)
        out.put((index, replay(store, clock, sequence_for(index, keys), barrier)))
    except BaseException as exc:
        out.put((index, f"{type(exc).__name__}: {exc}"))
        raise


def expected_distinct(index: int, keys: int) -> list[tuple[bool, int, float, float]]:
    clock = FakeClock(1_000_000.0)
    return replay(MemoryStore(clock=clock), clock, sequence_for(index, keys))


#: Periods so long that no window turns and no bucket refills a unit during a test on the real
#: clock (which every process shares, so expired states are reclaimed as in production).
EON = 1e9


def hot_limit(seed: int) -> Limit:
    return Limit(Rate(100, EON), ALGORITHM_NAMES[seed % len(ALGORITHM_NAMES)])


def chaos(name: str, directory: str, admitted_path: str, ready_fd: int, seed: int) -> None:
    """Check, insert and delete keys as fast as possible until killed; append one byte to
    ``admitted_path`` per request admitted on the hot key."""
    store = SharedMemoryStore(name, max_keys=1000, directory=directory)
    rng = random.Random(seed)
    hot = hot_limit(seed)
    churn = Limit(Rate(1, 0.001), "token_bucket")  # expires at once: sweeps delete while others insert
    fd = os.open(admitted_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.write(ready_fd, b"r")
    n = 0
    while True:
        n += 1
        if store.hit_now([f"rw:{{hot}}:{hot.suffix}"], [hot], [1.0]).allowed:
            os.write(fd, b"1")
        key = f"rw:{{churn|{seed}-{n}}}:{churn.suffix}"
        store.hit_now([key, f"rw:{{churn2|{rng.random()}}}"], [churn, churn], [1.0, 1.0])
        if n % 3 == 0:
            store.reset_now([key])


def burst_with(native: bool, name: str, directory: str, barrier: Any, out: Any) -> None:
    """``hot_key_burst`` with the C helpers (where built) or on the ``ctypes`` fallback."""
    os.environ["RATEWARDEN_SHM_NATIVE"] = "1" if native else "0"
    hot_key_burst(name, directory, barrier, out)


def final_check(name: str, directory: str, out: Any) -> None:
    """Open the table after the chaos and do one check of every kind."""
    store = SharedMemoryStore(name, max_keys=1000, directory=directory)
    limit = Limit(Rate(5, 60.0), "gcra")
    with Stopwatch() as clock:
        store.hit_now(["rw:{final}"], [limit], [1.0])
        store.peek_now(["rw:{final}"], [limit])
        store.reset_now(["rw:{final}"])
    out.put(clock)


def die_at(point: str, store: SharedMemoryStore, action: Any) -> None:
    """Run ``action()`` and SIGKILL this process at ``point`` of a write (``CRASH_POINTS`` in
    test_shared_memory.py): the ``struct`` objects that write an entry's state (``seg.bodies``)
    and the writer of the table's 32-bit fields (``table.FIELDS``) are swapped for ones that die before or after
    the chosen write; where the C helpers write the state (``_native.c``), their ``crash_at``
    hook dies at the same two steps. No source tracing, so it works in the mypyc-compiled build too."""
    import signal
    import struct

    from ratewarden.stores.shared_memory import layout, table

    seg = store._segment()  # this (forked) process's own mapping
    bases = {region.base for region in seg.regions}
    indexes = [(region.index, region.entries) for region in seg.regions]

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def fatal(offset: int, values: tuple[Any, ...]) -> tuple[bool, bool]:
        """(die before this write, die after it)."""
        count = offset in bases  # a region's entry count
        unlink = values == (0,) and any(lo <= offset < hi for lo, hi in indexes)  # an index slot emptied
        return {
            "insert-indexed-not-counted": (count, False),
            "insert-counted-still-dirty": (False, count),
            "delete-unlinked-not-moved": (False, unlink),
            "delete-moved-not-counted": (count, False),
        }.get(point, (False, False))

    class Fields(layout.Fields):
        def u32(self, mm: Any, offset: int, value: int) -> None:
            before, after = fatal(offset, (value,))
            if before:
                die()
            super().u32(mm, offset, value)
            if after:
                die()

    class Body(struct.Struct):
        def pack_into(self, buffer: Any, offset: int, *values: Any) -> None:
            if point == "state-half-written":
                die()
            super().pack_into(buffer, offset, *values)
            if point == "state-written-still-dirty":
                die()

    table.FIELDS = Fields()
    seg.bodies = [Body(s.format) for s in seg.bodies]
    if seg.native is not None:  # the C helpers write a one-key check's state themselves
        seg.native.crash_at = {"state-half-written": 1, "state-written-still-dirty": 2}.get(point, 0)
    action()
    os._exit(3)  # the point was never reached
