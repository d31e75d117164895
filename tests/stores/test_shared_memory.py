"""SharedMemoryStore across real processes: exact counts when spawned or forked, agreement with
MemoryStore over 40,000 keys, SIGKILL in the middle of checks, uvicorn and gunicorn workers, and
the file's safety (owner-only, incompatible layouts refused, names isolated).

The single-process semantics (vectors, property tests, bounds) run in tests/core on both local
stores: see tests/shm.py."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores import SharedMemoryStore
from ratewarden.stores.shared_memory import SharedMemoryError, segment_path
from tests.shm import unique_name
from tests.stores import shm_workers
from tests.stores.shm_workers import ALGORITHM_NAMES

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

def test_spawned_processes_150_concurrent_each_admit_exactly_100(shm_dir: Path) -> None:
    """3 spawned processes x 150 concurrent checks per algorithm on one key limited to 100."""
    ctx = multiprocessing.get_context("spawn")
    name = unique_name()
    barrier = ctx.Barrier(3)
    results = _spawn_all(ctx, shm_workers.hot_key_burst, [(name, str(shm_dir), barrier)] * 3)
    errors = [r for r in results if isinstance(r, str)]
    assert not errors, errors
    for algorithm in ALGORITHM_NAMES:
        allowed = sum(r[algorithm] for r in results)  # type: ignore[index]
        assert allowed == 100, f"{algorithm}: {allowed} allowed of 450 against a limit of 100"


def test_forked_workers_share_the_parents_table(shm_dir: Path) -> None:
    """A store opened before fork (gunicorn --preload) is re-mapped in each child: still exact."""
    store = SharedMemoryStore(unique_name(), max_keys=1000, directory=shm_dir, clock=shm_workers.frozen)
    limit = Limit(Rate(100, 3600.0), "sliding_window")
    key = "rw:{forked}:x"
    assert store.hit_now([key], [limit], [1.0]).remaining == 99  # the parent used it first
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()

    def child() -> None:
        results.put(sum(store.hit_now([key], [limit], [1.0]).allowed for _ in range(150)))

    procs = [ctx.Process(target=child) for _ in range(3)]
    for p in procs:
        p.start()
    counts = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sum(counts) == 99
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

def test_sigkill_in_the_middle_of_checks(shm_dir: Path) -> None:
    """Kill workers at random points while they check, insert and delete: the survivors never
    block, untouched keys keep their counts, and the hot key never admits more than its limit."""
    store = SharedMemoryStore(unique_name(), max_keys=1000, directory=shm_dir, clock=shm_workers.frozen)
    # One region (max_keys < 4096): every victim's insert and delete shares the bystanders' lock.
    bystanders = {f"rw:{{bystander{i}}}": Limit(Rate(10, 3600.0), a) for i, a in enumerate(ALGORITHM_NAMES * 3)}
    for i, (key, limit) in enumerate(bystanders.items()):
        for _ in range(i % 7 + 1):
            assert store.hit_now([key], [limit], [1.0]).allowed
    before = {key: store.peek_now([key], [limit])[0].remaining for key, limit in bystanders.items()}
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(7)
    admitted = shm_dir / "admitted"
    survivor_read, survivor_write = os.pipe()
    survivor = ctx.Process(target=shm_workers.chaos, args=(store, str(admitted) + "-survivor", survivor_write, 10_000))
    survivor.start()
    assert os.read(survivor_read, 1) == b"r"
    try:
        for round_ in range(25):
            ready_read, ready_write = os.pipe()
            victim = ctx.Process(target=shm_workers.chaos, args=(store, f"{admitted}-{round_}", ready_write, round_))
            victim.start()
            assert os.read(ready_read, 1) == b"r"
            time.sleep(rng.uniform(0.0, 0.02))
            os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
            victim.join(10)
            os.close(ready_read)
            os.close(ready_write)
            assert survivor.is_alive()
        # The survivor kept going: it finishes more checks within a bounded time.
        mark = admitted.with_name("admitted-survivor")
        t0 = time.monotonic()
        ctx2 = multiprocessing.get_context("spawn")
        out = ctx2.Queue()
        final = ctx2.Process(target=shm_workers.final_check, args=(store.name, str(shm_dir), out))
        final.start()
        took = out.get(timeout=30)
        final.join(10)
        assert final.exitcode == 0 and took < 5.0, took
        assert time.monotonic() - t0 < 30
        assert mark.exists()
    finally:
        survivor.kill()
        survivor.join(10)
        os.close(survivor_read)
        os.close(survivor_write)
    # Every file counts admissions on one hot key per algorithm: never more than its limit.
    per_algorithm: dict[str, int] = {}
    for path in shm_dir.glob("admitted-*"):
        seed = 10_000 if path.name.endswith("survivor") else int(path.name.rsplit("-", 1)[1])
        algorithm = ALGORITHM_NAMES[seed % len(ALGORITHM_NAMES)]
        per_algorithm[algorithm] = per_algorithm.get(algorithm, 0) + path.stat().st_size
    assert per_algorithm and all(n <= 100 for n in per_algorithm.values()), per_algorithm
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


def _storm(port: int, total: int) -> tuple[int, set[int]]:
    """``total`` requests, each on a new connection (so the kernel spreads them over workers)."""

    def one(_: int) -> tuple[int, int | None]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /limited HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        status = int(data.split(b" ", 2)[1])
        body = data.split(b"\r\n\r\n", 1)[1]
        return status, (int(json.loads(body)["pid"]) if status == 200 else None)

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, range(total)))
    codes = [c for c, _ in replies]
    assert set(codes) <= {200, 429}, codes
    return codes.count(200), {pid for _, pid in replies if pid is not None}


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


@pytest.mark.skipif(shutil.which("gunicorn") is None and not os.path.exists(
    os.path.join(os.path.dirname(sys.executable), "gunicorn")), reason="gunicorn is not installed (dev extra)")
@pytest.mark.parametrize("preload", [False, True], ids=["fork", "preload"])
def test_gunicorn_forked_workers_admit_exactly_the_limit(serve: object, shm_dir: Path, preload: bool) -> None:
    command = [sys.executable, "-m", "gunicorn", "tests.stores.shm_app:app", "-w", "2", "-k",
               "uvicorn.workers.UvicornWorker", "-b", "127.0.0.1:{port}", "--log-level", "warning",
               "--max-requests", "15"]  # workers are replaced mid-storm: the table outlives them
    if preload:
        command.append("--preload")
    (port,) = serve((command, f"shm:{unique_name()}:{shm_dir}", 25))  # type: ignore[operator]
    allowed, pids = _storm(port, 120)
    assert allowed == 25
    assert len(pids) >= 2


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
