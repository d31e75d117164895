"""SharedMemoryStore on a table whose bytes were overwritten with random garbage (the body, the
region headers and their locks, the file header too), or whose lock a stopped process holds:
every check returns within the lock deadline (``lock_timeout``) with ``SharedMemoryError``, the
limiter's insurance limiter keeps the limit, and nothing crashes the process (a garbage mutex made
``pthread_mutex_lock`` wait for ever, or abort the process in a glibc assertion).

Each garbage scenario runs in a forked child, so a hang or an abort fails the test instead of the
test run."""

from __future__ import annotations

import multiprocessing
import random
import time
from multiprocessing.connection import Connection
from pathlib import Path

import pytest

from ratewarden import ConfigurationError, Limiter
from ratewarden.stores import SharedMemoryStore
from ratewarden.stores.shared_memory import SharedMemoryError, locks
from ratewarden.stores.shared_memory.layout import HEADER_SIZE, MUTEX
from ratewarden.stores.shared_memory.mutex import robust_mutexes
from tests.shm import unique_name

LOCK_TIMEOUT = 0.5
BOUND = 5.0  # seconds any one call may take: ten deadlines, for a loaded machine
RATE = "3/day"  # and GCRA in the scenarios: no window boundary for a slow run to cross
ALGORITHM = "gcra"


def _overwrite(store: SharedMemoryStore, seed: int, start: int, keep: str) -> None:
    """Random bytes (``seed``) over the table from ``start``; ``keep``: nothing, each region mutex's
    kind words (so the C library is reached with a garbage lock word and owner), or each mutex whole
    (so the locks work and every structure under them is garbage)."""
    seg = store._segment()
    mm = seg.mm
    kept: list[tuple[int, bytes]] = []
    pthread = robust_mutexes() if seg.mutex else None
    for region in [*seg.regions, seg.overflow]:
        at = region.base + MUTEX
        if keep == "locks":
            kept.append((at, bytes(mm[at : at + 64])))
        elif keep == "lock kinds" and pthread is not None:
            kept += [(at + off, value) for off, value in pthread.signature]
    mm[start:] = random.Random(seed).randbytes(len(mm) - start)
    for at, value in kept:
        mm[at : at + len(value)] = value


def _scenario(directory: Path, lock: str, seed: int, start: int, keep: str, conn: Connection) -> None:
    """In the child: checks before and after the garbage; sends what they answered and took."""
    store = SharedMemoryStore(unique_name(), max_keys=1000, directory=directory, lock=lock, lock_timeout=LOCK_TIMEOUT)
    limiter = Limiter(store)
    for i in range(30):
        limiter.hit_sync(f"warm{i}", RATE)
    _overwrite(store, seed, start, keep)
    took: list[float] = []
    allowed: dict[str, int] = {"one": 0, "several": 0}
    errors: list[str] = []
    for name, rate in (("one", RATE), ("several", [RATE, "100/week"])):
        for _ in range(6):
            began = time.monotonic()
            allowed[name] += limiter.hit_sync(f"client-{name}", rate, algorithm=ALGORITHM).allowed
            took.append(time.monotonic() - began)
    for call in (lambda: store.peek_now(["k"], limiter.limits(RATE)), lambda: store.reset_now(["k"]), store.clear_now):
        began = time.monotonic()
        try:
            call()
        except SharedMemoryError as exc:
            errors.append(str(exc))
        took.append(time.monotonic() - began)
    conn.send((allowed, max(took), errors))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("start", "keep"), [(0, "nothing"), (HEADER_SIZE, "nothing"), (HEADER_SIZE, "lock kinds"),
                                             (HEADER_SIZE, "locks")], ids=["whole file", "body", "lock words", "data"])
def test_random_garbage_never_hangs_or_crashes_a_check(
    tmp_path: Path, lock: str, seed: int, start: int, keep: str
) -> None:
    if keep == "lock kinds" and lock != "mutex":
        pytest.skip("fcntl locks have no bytes in the file")
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_scenario, args=(tmp_path, lock, seed, start, keep, theirs))
    child.start()
    try:
        assert ours.poll(120), "no answer: a check hangs on the garbage"
        allowed, slowest, errors = ours.recv()
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0, f"the worker died (exit code {child.exitcode})"
    assert allowed == {"one": 3, "several": 3}, allowed  # the limit holds: the store's or the insurance limiter's
    assert slowest < BOUND, slowest
    assert all("corrupt" in e or "not free within" in e for e in errors), errors


def _hold(store: SharedMemoryStore, key: str, ready: Connection) -> None:
    """In the child: take ``key``'s region lock and keep it (a worker stopped while holding it)."""
    seg = store._segment()
    locks.lock(seg, store._slot(seg, key).region)
    ready.send(True)
    time.sleep(120)


def test_a_lock_held_too_long_fails_the_check_within_its_deadline(tmp_path: Path, lock: str) -> None:
    """Another process holds the key's region lock and does not let go: the check waits
    ``lock_timeout``, not for ever, then fails with ``reason="timeout"``; through the limiter the
    insurance limiter decides and the failure is counted as a timeout."""
    store = SharedMemoryStore(unique_name(), max_keys=100, directory=tmp_path, lock=lock, lock_timeout=LOCK_TIMEOUT)
    limiter = Limiter(store)
    limits = limiter.limits(RATE)
    (key,) = limiter.keys_for("client", limits)
    assert limiter.hit_sync("client", RATE).remaining == 2
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe()
    holder = ctx.Process(target=_hold, args=(store, key, theirs))
    holder.start()
    try:
        assert ours.poll(30)
        began = time.monotonic()
        with pytest.raises(SharedMemoryError, match=r"not free within 0\.5 s.*held its lock too long") as raised:
            store.hit_now([key], list(limits), [1.0])
        assert raised.value.reason == "timeout"
        statuses = [limiter.hit_sync("client", RATE).allowed for _ in range(4)]
        assert time.monotonic() - began < 5 * BOUND
    finally:
        holder.kill()
        holder.join(30)
    assert statuses == [True] * 3 + [False]  # the insurance limiter: a fresh count in this process
    assert limiter.without_store()["timeout"] == 4


def test_lock_timeout_is_an_option_of_the_store_and_its_url(tmp_path: Path) -> None:
    store = SharedMemoryStore.from_url(f"shm://{unique_name()}?lock_timeout=0.25&directory={tmp_path}")
    assert store.lock_timeout == 0.25 and store._segment().lock_timeout == 0.25
    for bad in (0, -1.0, float("nan"), 7200):
        with pytest.raises(ConfigurationError, match="lock_timeout must be"):
            SharedMemoryStore(unique_name(), directory=tmp_path, lock_timeout=bad)
    # A string is refused by the pure store's check, and by the compiled store at the call (TypeError).
    with pytest.raises((ConfigurationError, TypeError), match=r"lock_timeout must be|float object expected"):
        SharedMemoryStore(unique_name(), directory=tmp_path, lock_timeout="1")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"lock_timeout=.*must be a number"):
        SharedMemoryStore.from_url(f"shm://{unique_name()}?lock_timeout=soon&directory={tmp_path}")
    with pytest.raises(SharedMemoryError, match=r"lock_timeout=0\.25; open it with the same settings"):
        SharedMemoryStore(store.name, directory=tmp_path, lock_timeout=1.0)
