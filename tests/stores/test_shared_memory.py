"""SharedMemoryStore across real processes: exact counts when spawned or forked, agreement with
MemoryStore over 40,000 keys, SIGKILL in the middle of checks, uvicorn and gunicorn workers, and
the file's safety (owner-only, incompatible layouts refused, names isolated).

The single-process semantics (vectors, property tests, bounds) run in tests/core on both local
stores: see tests/shm.py."""

from __future__ import annotations

import functools
import importlib.util
import multiprocessing
import os
import random
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores import SharedMemoryStore
from ratewarden.stores.shared_memory import SharedMemoryError, segment_path
from tests.shm import LOCK_KINDS, NATIVE, unique_name
from tests.stores import shm_workers
from tests.stores.shm_workers import ALGORITHM_NAMES
from tests.timing import Stopwatch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shm_dir(tmp_path: Path) -> Path:
    return tmp_path


def _spawn_all(
    ctx: multiprocessing.context.BaseContext, target: object, args: list[tuple[object, ...]], meanwhile: object = None
) -> list[object]:
    out = ctx.Queue()  # type: ignore[attr-defined]
    procs = [ctx.Process(target=target, args=(*a, out)) for a in args]  # type: ignore[attr-defined]
    for p in procs:
        p.start()
    if callable(meanwhile):
        meanwhile()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, results
    return results


# --- exactness across processes ------------------------------------------------------------------

def test_spawned_processes_150_concurrent_each_admit_exactly_100(shm_dir: Path, lock: str) -> None:
    """3 spawned processes x 150 concurrent checks per algorithm on one key limited to 100."""
    ctx = multiprocessing.get_context("spawn")
    name = unique_name()
    SharedMemoryStore(name, max_keys=1000, directory=shm_dir, lock=lock)  # the workers adopt its lock kind
    barrier = ctx.Barrier(3)
    results = _spawn_all(ctx, shm_workers.hot_key_burst, [(name, str(shm_dir), barrier)] * 3)
    errors = [r for r in results if isinstance(r, str)]
    assert not errors, errors
    for algorithm in ALGORITHM_NAMES:
        allowed = sum(r[algorithm] for r in results)  # type: ignore[index]
        assert allowed == 100, f"{algorithm}: {allowed} allowed of 450 against a limit of 100"


def test_c_helpers_and_ctypes_processes_share_one_table_exactly(shm_dir: Path) -> None:
    """The C helpers and the ctypes fallback take the same mutexes and write the same entries:
    processes of both kinds on one key admit exactly the limit together."""
    ctx = multiprocessing.get_context("spawn")
    name = unique_name()
    SharedMemoryStore(name, max_keys=1000, directory=shm_dir, lock=LOCK_KINDS[0])  # mutexes where there are
    barrier = ctx.Barrier(4)
    args: list[tuple[object, ...]] = [(native, name, str(shm_dir), barrier) for native in (True, False, True, False)]
    results = _spawn_all(ctx, shm_workers.burst_with, args)
    errors = [r for r in results if isinstance(r, str)]
    assert not errors, errors
    for algorithm in ALGORITHM_NAMES:
        allowed = sum(r[algorithm] for r in results)  # type: ignore[index]
        assert allowed == 100, f"{algorithm}: {allowed} allowed of 600 against a limit of 100"


def test_c_helpers_are_used_where_built(shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiled Linux build ships the C helpers and a mutex table uses them (unless switched off
    with RATEWARDEN_SHM_NATIVE=0); a pure-Python install runs on ctypes."""
    import ratewarden

    if ratewarden.COMPILED and sys.platform.startswith("linux"):
        assert NATIVE, "the compiled build has no ratewarden.stores.shared_memory._native"
    if not sys.platform.startswith("linux"):
        assert not NATIVE
        return
    used = SharedMemoryStore(unique_name(), max_keys=100, directory=shm_dir, lock="mutex")
    assert (used._segment().native is not None) == NATIVE
    monkeypatch.setenv("RATEWARDEN_SHM_NATIVE", "0")
    fallback = SharedMemoryStore(unique_name(), max_keys=100, directory=shm_dir, lock="mutex")
    assert fallback._segment().native is None
    limit = Limit(Rate(3, 3600.0), "token_bucket")
    for store in (used, fallback):
        assert [store.hit_now(["rw:{k}"], [limit], [1.0]).allowed for _ in range(4)] == [True, True, True, False]


@pytest.mark.parametrize("kind", [k for k in LOCK_KINDS if k.startswith("mutex")])
def test_a_thread_waiting_for_a_region_lets_the_others_run(
    shm_dir: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check that waits for a region's mutex held by another thread releases the GIL while it
    waits (else the holder could never finish); once released, it goes through."""
    if kind == "mutex-ctypes":
        monkeypatch.setenv("RATEWARDEN_SHM_NATIVE", "0")
    from ratewarden.stores.shared_memory import locks

    def check() -> None:
        import threading

        store = SharedMemoryStore(unique_name(), max_keys=100, directory=shm_dir, lock="mutex", lock_timeout=60.0)
        limit = Limit(Rate(5, 3600.0), "gcra")
        assert store.hit_now(["rw:{k}"], [limit], [1.0]).remaining == 4
        seg = store._segment()
        assert (seg.native is not None) == (NATIVE and kind == "mutex")
        region = store._where["rw:{k}"][2]
        locks.lock(seg, region)  # held by this thread
        done: list[int] = []
        waiter = threading.Thread(target=lambda: done.append(store.hit_now(["rw:{k}"], [limit], [1.0]).remaining))
        waiter.start()
        time.sleep(0.3)  # needs the GIL: the waiter must not sit on it
        assert waiter.is_alive() and not done
        locks.unlock(seg, region)
        waiter.join(5)
        assert done == [3]

    _run_with_deadline(check, 20)


@pytest.mark.parametrize("kind", [k for k in LOCK_KINDS if k.startswith("mutex")])
def test_a_check_takes_over_a_region_whose_holder_died(
    shm_dir: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process SIGKILLed while it holds a region's mutex (between two writes): the next one-key
    check is told EOWNERDEAD, takes the lock over, says so, and counts on from the stored state."""
    if kind == "mutex-ctypes":
        monkeypatch.setenv("RATEWARDEN_SHM_NATIVE", "0")
    import logging

    from ratewarden.stores.shared_memory import locks

    store = SharedMemoryStore(unique_name(), max_keys=100, directory=shm_dir, lock="mutex")
    limit = Limit(Rate(5, 3600.0), "gcra")
    assert store.hit_now(["rw:{k}"], [limit], [1.0]).remaining == 4
    ctx = multiprocessing.get_context("fork")

    def die_holding_the_lock() -> None:
        seg = store._segment()
        locks.lock(seg, store._slot(seg, "rw:{k}").region)
        os.kill(os.getpid(), signal.SIGKILL)

    victim = ctx.Process(target=die_holding_the_lock)
    victim.start()
    victim.join(30)
    assert victim.exitcode == -signal.SIGKILL

    def survivor() -> None:
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logging.getLogger("ratewarden.stores.shared_memory").addHandler(handler)
        assert (store._segment().native is not None) == (NATIVE and kind == "mutex")
        assert [store.hit_now(["rw:{k}"], [limit], [1.0]).remaining for _ in range(2)] == [3, 2]
        assert any("holder died" in r.getMessage() for r in records), [r.getMessage() for r in records]

    _run_with_deadline(survivor, 20)


def test_forked_workers_share_the_parents_table(shm_dir: Path, lock: str) -> None:
    """A store opened before fork (gunicorn --preload) is re-mapped in each child: still exact."""
    store = SharedMemoryStore(unique_name(), max_keys=1000, directory=shm_dir, clock=shm_workers.frozen, lock=lock)
    limit = Limit(Rate(100, 3600.0), "sliding_window")
    key = "rw:{forked}:x"
    assert store.hit_now([key], [limit], [1.0]).remaining == 99  # the parent used it first
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()

    def child() -> None:
        allowed = sum(store.hit_now([key], [limit], [1.0]).allowed for _ in range(150))
        results.put((allowed, store._pid == os.getpid()))  # the fork was noticed: mapped again

    procs = [ctx.Process(target=child) for _ in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert all(remapped for _, remapped in got)
    assert sum(count for count, _ in got) == 99
    assert not store.hit_now([key], [limit], [1.0]).allowed


def test_four_processes_ten_thousand_keys_each_agree_with_memory_store(shm_dir: Path) -> None:
    """40,000 keys written concurrently into shared regions (inserts, sweeps, deletes racing):
    every decision equals a single MemoryStore's fed the same sequence."""
    ctx = multiprocessing.get_context("spawn")
    name = unique_name()
    keys = 10_000
    barrier = ctx.Barrier(4)
    expected: dict[int, list[tuple[bool, int, float, float]]] = {}

    def replay_on_memory() -> None:  # while the workers run
        for i in range(4):
            expected[i] = shm_workers.expected_distinct(i, keys)

    args: list[tuple[object, ...]] = [(name, str(shm_dir), i, keys, barrier) for i in range(4)]
    results = _spawn_all(ctx, shm_workers.distinct_keys, args, replay_on_memory)
    for index, got in results:  # type: ignore[misc]
        assert not isinstance(got, str), got
        want = expected[index]
        assert len(got) == len(want) > keys
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g == w, f"process {index} step {step}: {g} != {w}"


# --- crash safety --------------------------------------------------------------------------------

# The lock deadline of the chaos below. What it tests is that a killed holder never holds the others
# up (its lock is free at once), not the deadline (test_shm_garbage.py's process holding a lock
# does). Processes checking one region in a loop on a busy machine (load 7-11 on 2 cores) wait for
# a live holder the scheduler left waiting as long as the default 0.5 s (measured: one survivor
# step of this test 0.54 s; four such processes for 20 s, lock waits cut at 0.5 s), and a check
# that waited past it fails with "was not free within 0.5 s", which ends the survivor. The final
# check's own bound (5 s, plus its run-queue wait) is what says nobody is held up.
CHAOS_LOCK_TIMEOUT = 10.0


def _with_chaos_lock_timeout(target: Callable[..., None], *args: object) -> None:
    """``target(*args)`` in this (forked) process, each table it opens with ``CHAOS_LOCK_TIMEOUT``."""
    shm_workers.SharedMemoryStore = functools.partial(  # type: ignore[misc]
        SharedMemoryStore, lock_timeout=CHAOS_LOCK_TIMEOUT
    )
    target(*args)


def test_sigkill_in_the_middle_of_checks(shm_dir: Path, lock: str) -> None:
    """Kill workers at random points while they check, insert and delete: the survivors never
    block, untouched keys keep their counts, and a hot key never admits more than its limit."""
    name = unique_name()
    # One region (max_keys < 4096): every victim's insert and delete shares the bystanders' lock.
    store = SharedMemoryStore(name, max_keys=1000, directory=shm_dir, lock=lock, lock_timeout=CHAOS_LOCK_TIMEOUT)
    bystanders = {
        f"rw:{{bystander{i}}}": Limit(Rate(10, shm_workers.EON), a) for i, a in enumerate(ALGORITHM_NAMES * 3)
    }
    for i, (key, limit) in enumerate(bystanders.items()):
        for _ in range(i % 7 + 1):
            assert store.hit_now([key], [limit], [1.0]).allowed
    before = {key: store.peek_now([key], [limit])[0].remaining for key, limit in bystanders.items()}
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(7)
    survivor_read, survivor_write = os.pipe()
    survivor = ctx.Process(
        target=_with_chaos_lock_timeout,
        args=(shm_workers.chaos, name, str(shm_dir), str(shm_dir / "admitted-s"), survivor_write, 1000),
    )
    survivor.start()
    assert os.read(survivor_read, 1) == b"r"
    try:
        # Three victims at a time: more of them are killed while they hold a lock (a write cut
        # short mid-way, as a single victim rarely is on two cores).
        for round_ in range(12):
            victims = []
            for seed in range(3 * round_, 3 * round_ + 3):
                ready_read, ready_write = os.pipe()
                victim = ctx.Process(
                    target=_with_chaos_lock_timeout,
                    args=(shm_workers.chaos, name, str(shm_dir), str(shm_dir / f"admitted-{seed}"), ready_write, seed),
                )
                victim.start()
                victims.append((victim, ready_read, ready_write))
            for _, ready_read, _ in victims:
                assert os.read(ready_read, 1) == b"r"
            for victim, ready_read, ready_write in victims:
                time.sleep(rng.uniform(0.0, 0.01))
                os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
                victim.join(10)
                os.close(ready_read)
                os.close(ready_write)
            assert survivor.is_alive(), f"the survivor ended (exit code {survivor.exitcode}; its error is above)"
        progress = (shm_dir / "admitted-s").stat().st_size
        # A new process does one check of every kind within a bounded time, and so does the survivor.
        out = ctx.Queue()
        final = ctx.Process(target=_with_chaos_lock_timeout, args=(shm_workers.final_check, name, str(shm_dir), out))
        final.start()
        took = out.get(timeout=30)
        final.join(10)
        assert final.exitcode == 0 and took.within(5.0), took
    finally:
        survivor.kill()
        survivor.join(10)
        os.close(survivor_read)
        os.close(survivor_write)
    admitted: dict[str, int] = {}
    for path in shm_dir.glob("admitted-*"):
        seed = 1000 if path.name == "admitted-s" else int(path.name.rsplit("-", 1)[1])
        algorithm = shm_workers.hot_limit(seed).algorithm
        admitted[algorithm] = admitted.get(algorithm, 0) + path.stat().st_size
    assert set(admitted) == set(ALGORITHM_NAMES)
    assert all(n <= 100 for n in admitted.values()), admitted  # never more than the limit
    assert progress > 0
    after = {key: store.peek_now([key], [limit])[0].remaining for key, limit in bystanders.items()}
    assert after == before


# --- real servers --------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def serve(shm_dir: Path) -> Iterator[object]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(*servers: tuple[list[str], str, int]) -> list[int]:
        """Start every server at once; return their ports when each answers on every worker."""
        ports = []
        for command, store, limit in servers:
            port = _free_port()
            env = dict(os.environ, RW_STORE=store, RW_LIMIT=str(limit), PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}")
            argv = [a.replace("{port}", str(port)) for a in command]
            procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            ports.append(port)
        deadline = time.monotonic() + 60
        for proc, port in zip(procs[-len(ports):], ports, strict=True):
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                        break
                except OSError:
                    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                    assert time.monotonic() < deadline, "server did not start"
                    time.sleep(0.1)
        time.sleep(1.5)  # the listening socket is shared: let every worker finish importing the app
        return ports

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def _storm(port: int, total: int) -> tuple[int, set[int]]:
    """``total`` requests, each on a new connection (so the kernel spreads them over workers);
    returns the number admitted and the worker processes that answered."""

    def one(_: int) -> tuple[int, int]:
        for _attempt in range(10):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                    sock.sendall(b"GET /limited HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
                    data = b""
                    while chunk := sock.recv(65536):
                        data += chunk
            except (ConnectionResetError, ConnectionRefusedError):
                data = b""
            if data:
                break
            # A worker leaving (gunicorn max_requests) drops connections it had not started on;
            # uvicorn finishes the requests it started, so the retried one was never counted.
            time.sleep(0.05)
        head = data.split(b"\r\n\r\n", 1)[0].lower()
        pid = int(head.split(b"x-pid: ", 1)[1].split(b"\r\n", 1)[0])
        return int(data.split(b" ", 2)[1]), pid

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, range(total)))
    codes = [c for c, _ in replies]
    assert set(codes) <= {200, 429}, codes
    return codes.count(200), {pid for _, pid in replies}


UVICORN = [sys.executable, "-m", "uvicorn", "tests.stores.shm_app:app", "--workers", "2",
           "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning"]


def test_uvicorn_two_workers_admit_exactly_the_limit(serve: object, shm_dir: Path) -> None:
    memory, shared = serve((UVICORN, "memory", 20), (UVICORN, f"shm:{unique_name()}:{shm_dir}", 20))  # type: ignore[operator]
    allowed, pids = _storm(memory, 100)
    assert len(pids) == 2, "the kernel sent every connection to one worker; cannot compare"
    assert allowed > 20, f"MemoryStore was expected to over-admit across workers, admitted {allowed}"
    allowed, pids = _storm(shared, 100)
    assert len(pids) == 2
    assert allowed == 20


@pytest.mark.skipif(importlib.util.find_spec("gunicorn") is None, reason="gunicorn is not installed (dev extra)")
@pytest.mark.parametrize("preload", [False, True], ids=["fork", "preload"])
def test_gunicorn_forked_workers_admit_exactly_the_limit(serve: object, shm_dir: Path, preload: bool) -> None:
    command = [sys.executable, "-m", "gunicorn", "tests.stores.shm_app:app", "-w", "2", "-k",
               "uvicorn.workers.UvicornWorker", "-b", "127.0.0.1:{port}", "--log-level", "warning",
               "--max-requests", "15"]  # workers are replaced mid-storm: the table outlives them
    if preload:
        command.append("--preload")
    (port,) = serve((command, f"shm:{unique_name()}:{shm_dir}", 25))  # type: ignore[operator]
    allowed, pids = _storm(port, 60)
    time.sleep(3.0)  # the workers past max_requests exit and gunicorn forks new ones
    more, new_pids = _storm(port, 60)
    pids |= new_pids
    assert allowed + more == 25
    assert len(pids) > 2, pids  # workers were replaced (max_requests) and the table outlived them


# --- the file --------------------------------------------------------------------------------------

async def test_file_is_owner_only_and_close_keeps_it(shm_dir: Path) -> None:
    store = SharedMemoryStore(unique_name(), max_keys=100, directory=shm_dir)
    path = store.path
    assert path == segment_path(store.name, shm_dir) and path.name == f"ratewarden-{store.name}.shm"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    await store.close()
    assert path.exists()  # other workers may still use it
    store.unlink()
    assert not path.exists()


def test_default_directory_is_dev_shm() -> None:
    expected = "/dev/shm" if os.path.isdir("/dev/shm") else None
    if expected:
        assert segment_path("x").parent == Path(expected)


async def test_group_or_world_writable_file_is_refused(shm_dir: Path) -> None:
    name = unique_name()
    await SharedMemoryStore(name, max_keys=100, directory=shm_dir).close()
    path = segment_path(name, shm_dir)
    os.chmod(path, 0o666)
    with pytest.raises(SharedMemoryError, match="world-writable"):
        SharedMemoryStore(name, max_keys=100, directory=shm_dir)


def test_symlink_is_refused(shm_dir: Path) -> None:
    name = unique_name()
    (shm_dir / "elsewhere").write_bytes(b"")
    os.symlink(shm_dir / "elsewhere", segment_path(name, shm_dir))
    with pytest.raises(SharedMemoryError, match="symbolic link"):
        SharedMemoryStore(name, max_keys=100, directory=shm_dir)


async def test_incompatible_file_gives_a_clear_error(shm_dir: Path) -> None:
    name = unique_name()
    path = segment_path(name, shm_dir)
    path.write_bytes(b"something else entirely" * 200)
    path.chmod(0o600)
    with pytest.raises(SharedMemoryError) as info:
        SharedMemoryStore(name, max_keys=100, directory=shm_dir)
    assert str(path) in str(info.value) and "rm " in str(info.value)
    other = unique_name()
    await SharedMemoryStore(other, max_keys=100, directory=shm_dir).close()
    other_path = segment_path(other, shm_dir)
    raw = bytearray(other_path.read_bytes())
    raw[8] = 99  # a future layout version
    other_path.write_bytes(bytes(raw))
    with pytest.raises(SharedMemoryError, match="layout 99"):
        SharedMemoryStore(other, max_keys=100, directory=shm_dir)


def test_different_sizes_for_one_name_are_refused(shm_dir: Path) -> None:
    name = unique_name()
    SharedMemoryStore(name, max_keys=100, directory=shm_dir)
    code = (
        "import sys; from ratewarden.stores.shared_memory import SharedMemoryStore, SharedMemoryError\n"
        f"try: SharedMemoryStore({name!r}, max_keys=200, directory={str(shm_dir)!r})\n"
        "except SharedMemoryError as e: print(e); sys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert done.returncode == 3, done.stderr
    assert "max_keys=100" in done.stdout and "max_keys=200" in done.stdout


def test_names_are_isolated(shm_dir: Path) -> None:
    limit = Limit(Rate(1, 60.0))
    a = SharedMemoryStore(unique_name(), max_keys=100, directory=shm_dir)
    b = SharedMemoryStore(unique_name(), max_keys=100, directory=shm_dir)
    assert a.hit_now(["k"], [limit], [1.0]).allowed
    assert not a.hit_now(["k"], [limit], [1.0]).allowed
    assert b.hit_now(["k"], [limit], [1.0]).allowed
    again = SharedMemoryStore(a.name, max_keys=100, directory=shm_dir)
    assert not again.hit_now(["k"], [limit], [1.0]).allowed


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "x" * 101, "sp ace"])
def test_bad_names_are_refused(bad: str, shm_dir: Path) -> None:
    with pytest.raises(ValueError, match="name"):
        SharedMemoryStore(bad, directory=shm_dir)


def test_sliding_log_beyond_the_bound_is_a_clear_error(shm_dir: Path) -> None:
    store = SharedMemoryStore(unique_name(), max_keys=100, directory=shm_dir, log_size=50)
    big = Limit(Rate(100, 60.0), "sliding_log")
    with pytest.raises(ValueError, match=r"100 timestamps.*at most 50 \(log_size\)"):
        store.check_limits([big])
    with pytest.raises(ValueError, match="log_size"):
        store.hit_now(["k"], [big], [1.0])
    assert store.hit_now(["k"], [Limit(Rate(50, 60.0), "sliding_log")], [1.0]).allowed
    assert store.hit_now(["k2"], [Limit(Rate(1000, 60.0), "sliding_window")], [1.0]).allowed


async def test_adjust_refunds_and_penalises_like_memory(shm_dir: Path) -> None:
    from ratewarden.charges import adjust
    from ratewarden.stores.memory import MemoryStore
    from tests.vectors.runner import FakeClock

    clock = FakeClock(1_000_000.0)
    shm = SharedMemoryStore(unique_name(), max_keys=100, directory=shm_dir, clock=clock)
    mem = MemoryStore(clock=clock)
    rng = random.Random(3)
    limits = [Limit(Rate(5, 10.0), a) for a in ALGORITHM_NAMES]
    for step in range(400):
        clock.advance(rng.choice([0.0, 0.1, 1.0, 4.0]))
        i = rng.randrange(len(limits))
        args = ([f"k{i}"], [limits[i]])
        if rng.random() < 0.5:
            got, want = await shm.hit(*args, [1.0]), await mem.hit(*args, [1.0])
            assert got == want, step
        else:
            amount = rng.choice([-3.0, -1.0, 1.0, 2.0, 9.0])
            assert await adjust(shm, *args, [amount]) == await adjust(mem, *args, [amount]), step
        assert shm.state_of(f"k{i}") == mem.state_of(f"k{i}"), step


CRASH_POINTS = {
    # point of the write where the process dies: what it was doing (shm_workers.die_at)
    "state-half-written": "hit",  # the entry marked dirty, its state not written
    "state-written-still-dirty": "hit",  # the state written, the entry not yet marked clean
    "insert-indexed-not-counted": "insert",  # the new entry indexed, the region's count not raised
    "insert-counted-still-dirty": "insert",  # counted, not yet marked clean
    "delete-unlinked-not-moved": "delete",  # unlinked from the index, the last entry not moved in
    "delete-moved-not-counted": "delete",  # moved, the region's count not lowered
}


@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_crash_at_each_step_of_a_write(shm_dir: Path, point: str, lock: str) -> None:
    """A process SIGKILLed at each step of a write: the next lock holder carries on at once, every
    other key keeps its state, and the key being written is never given more than its limit."""
    doing = CRASH_POINTS[point]
    store = SharedMemoryStore(unique_name(), max_keys=500, directory=shm_dir, clock=shm_workers.frozen, lock=lock)
    limits = {f"rw:{{k{i}}}": Limit(Rate(10, 3600.0), a) for i, a in enumerate(ALGORITHM_NAMES * 4)}
    for i, (key, limit) in enumerate(limits.items()):
        for _ in range(i % 5 + 1):
            assert store.hit_now([key], [limit], [1.0]).allowed
    target = next(iter(limits))  # not the last entry, so deleting it moves another entry
    new_key = "rw:{newcomer}"
    fw = Limit(Rate(10, 3600.0), "fixed_window")
    action = {
        "hit": lambda: store.hit_now([target], [limits[target]], [1.0]),
        "insert": lambda: store.hit_now([new_key], [fw], [1.0]),
        "delete": lambda: store.reset_now([target]),
    }[doing]
    before = {key: store.peek_now([key], [limit])[0] for key, limit in limits.items()}
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=shm_workers.die_at, args=(point, store, action))
    proc.start()
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL, f"the crash point was not reached ({proc.exitcode})"

    def survivor() -> None:
        with Stopwatch() as clock:
            after = {key: store.peek_now([key], [limit])[0] for key, limit in limits.items()}
        assert clock.within(2.0), clock
        for key in limits:
            if key != target:
                assert after[key] == before[key], key  # other keys intact
        if doing == "hit":
            # The key it was writing is re-initialised as fully used: nothing more gets through.
            assert after[target].remaining == 0
            assert not store.hit_now([target], [limits[target]], [1.0]).allowed
        elif doing == "delete":
            assert after[target].remaining == 10  # the reset it was doing is completed
        else:
            got = store.peek_now([new_key], [fw])[0].remaining
            assert got in (10, 0), got  # never charged (not yet counted) or fully used (counted, dirty)
            assert store.hit_now([new_key], [fw], [1.0]).allowed == (got == 10)
        # The table still works for every key, new and old, and finds each one where it is.
        for i in range(50):
            assert store.hit_now([f"rw:{{later{i}}}"], [fw], [1.0]).remaining == 9
        for key, limit in limits.items():
            if key != target:
                assert store.hit_now([key], [limit], [1.0]).remaining == before[key].remaining - 1
        assert len(store) == len(limits) + 50 + (doing == "insert") - (doing == "delete")

    _run_with_deadline(survivor, 30)


def test_header_and_index_fields_are_written_whole(shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``struct.pack_into`` zeroes a field before writing its value, so a process killed in between
    leaves it at 0: a region's count at 0 loses every key of the region (each starts afresh, up to
    a second limit; seen under SIGKILL chaos). Inserts, rewrites, sweeps of a full region, deletes
    and a recovery write every count, op, cursor, index slot and expiry bound through
    ``table.FIELDS`` (one copy of the final bytes); only entry states, which their dirty byte
    covers, are packed in place."""
    from ratewarden.stores.shared_memory import table
    from ratewarden.stores.shared_memory.layout import OP_DELETE, R_OP, R_OP_A, R_OP_B

    now = [1000.0]
    store = SharedMemoryStore(unique_name(), max_keys=64, directory=shm_dir, clock=lambda: now[0])
    seg = store._segment()
    guarded = [(r.base, r.entries) for r in [*seg.regions, seg.overflow]]  # region headers and indexes
    packed: list[int] = []

    class Guarded(struct.Struct):
        def pack_into(self, buffer: object, offset: int, *values: object) -> None:
            if any(lo <= offset < hi for lo, hi in guarded):
                packed.append(offset)
            super().pack_into(buffer, offset, *values)  # type: ignore[arg-type]

    for name in ("U32", "F64", "RHEAD", "BODY_HEAD"):
        monkeypatch.setattr(table, name, Guarded(getattr(table, name).format))
    short = Limit(Rate(2, 1.0), "token_bucket")
    long = Limit(Rate(5, 3600.0), "gcra")
    for i in range(60):
        assert store.hit_now([f"rw:{{old{i}}}"], [short], [1.0]).allowed
    assert store.hit_now(["rw:{keep}"], [long], [1.0]).allowed
    now[0] += 10.0  # every short key expires; the region fills and is swept whole
    for i in range(60):
        assert store.hit_now([f"rw:{{new{i}}}"], [short], [1.0]).allowed
    store.reset_now([f"rw:{{new{i}}}" for i in range(0, 60, 3)])
    region = seg.regions[0]
    # A delete of entry 0 recorded and left half-done, as a killed process leaves it: recovered
    # by the next lock holder (the move redone, the count lowered).
    n = table.count(seg, region)
    keep = store._slot(seg, "rw:{keep}")
    victim = 0 if table.find(seg, region, keep.digest, keep.home) != 0 else 1
    table.FIELDS.u32(seg.mm, region.base + R_OP_A, victim)
    table.FIELDS.u32(seg.mm, region.base + R_OP_B, n - 1)
    table.FIELDS.u32(seg.mm, region.base + R_OP, OP_DELETE)
    assert store.peek_now(["rw:{keep}"], [long])[0].remaining == 4
    assert store.hit_now(["rw:{keep}"], [long], [1.0]).remaining == 3
    assert packed == [], f"struct.pack_into wrote header or index fields at {sorted(set(packed))}"
    assert len(store) == n - 1


def _run_with_deadline(check: object, timeout: float) -> None:
    """Run ``check`` in a forked process so a deadlock or a corrupt probe loop fails the test
    instead of hanging it; re-raise what it raised."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()

    def child() -> None:
        try:
            check()  # type: ignore[operator]
            out.put(None)
        except BaseException as exc:  # reported to the parent
            import traceback

            out.put("".join(traceback.format_exception(exc)))

    proc = ctx.Process(target=child)
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
        pytest.fail(f"the surviving process did not finish within {timeout} s (deadlock or corrupt table)")
    problem = out.get(timeout=5)
    assert problem is None, problem


# --- URLs and the policy file --------------------------------------------------------------------

async def test_store_url_opens_the_same_table(shm_dir: Path) -> None:
    from ratewarden.stores.memory import MemoryStore
    from ratewarden.stores.urls import open_store

    name = unique_name()
    store = open_store(f"shm://{name}?max_keys=300&log_size=16&directory={shm_dir}")
    assert isinstance(store, SharedMemoryStore)
    assert (store.name, store.max_keys, store.log_size, store.path.parent) == (name, 300, 16, shm_dir)
    direct = SharedMemoryStore(name, max_keys=300, log_size=16, directory=shm_dir)
    limit = Limit(Rate(1, 60.0))
    assert store.hit_now(["k"], [limit], [1.0]).allowed
    assert not direct.hit_now(["k"], [limit], [1.0]).allowed
    memory = open_store("memory://?max_keys=10")
    assert isinstance(memory, MemoryStore) and memory.max_keys == 10


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("shm://", "names no table"),
        ("shm://api?max_key=5", "unknown option 'max_key'; known options: max_keys, log_size, directory"),
        ("shm://api?max_keys=lots", "max_keys='lots' must be a whole number"),
        ("shm://a%2Fb", "name must be"),
        ("memory://x", "takes no name"),
        ("mongodb://host", "unsupported store URL"),
    ],
)
def test_bad_store_urls_name_the_mistake(url: str, message: str) -> None:
    from ratewarden.stores.urls import check_store_url

    with pytest.raises(ValueError, match=re.escape(message)):
        check_store_url(url)


def test_policy_file_names_the_store(shm_dir: Path) -> None:
    from ratewarden.policy.loader import parse_policy
    from ratewarden.policy.schema import PolicyError

    name = unique_name()
    text = f"""
[settings]
store = "shm://{name}?max_keys=500&directory={shm_dir}"

[[rules]]
path = "/api/*"
rate = "2/minute"
"""
    policy = parse_policy(text, source="policy.toml")
    assert policy.store == f"shm://{name}?max_keys=500&directory={shm_dir}"
    store = policy.make_store()
    assert isinstance(store, SharedMemoryStore) and store.name == name and store.max_keys == 500
    assert type(parse_policy('[[rules]]\npath = "/x"\nrate = "1/s"\n').make_store()).__name__ == "MemoryStore"
    with pytest.raises(PolicyError, match=r"policy.toml:3: settings.store: .*unknown option 'size'"):
        parse_policy('[settings]\nalgorithm = "gcra"\nstore = "shm://api?size=3"\n', source="policy.toml")


async def test_lock_kind_is_recorded_in_the_file(shm_dir: Path) -> None:
    name = unique_name()
    await SharedMemoryStore(name, max_keys=100, directory=shm_dir, lock="lockf").close()
    adopted = SharedMemoryStore(name, max_keys=100, directory=shm_dir)  # auto: adopts the file's kind
    assert adopted._segment().lock_kind == "lockf"
    await adopted.close()
    if "mutex" in LOCK_KINDS:
        with pytest.raises(SharedMemoryError, match="uses lockf locks, not mutex"):
            SharedMemoryStore(name, max_keys=100, directory=shm_dir, lock="mutex")
    with pytest.raises(ValueError, match="lock must be"):
        SharedMemoryStore(name, max_keys=100, directory=shm_dir, lock="spin")


def test_docs_example_runs() -> None:
    import contextlib
    import io

    doc = (ROOT / "docs" / "stores.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "SharedMemoryStore(" in b]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/stores.md", "exec"), {"__name__": "docs_example"})
    assert out.getvalue().split() == ["True", "2", "True", "1", "True", "0", "False", "0"]
