"""SharedMemoryStore vs MemoryStore: the middleware's extra cost per allowed request, and one hot
key contended by two processes.

1. Extra cost: direct ASGI calls on one FastAPI app shape (bare, middleware + MemoryStore,
   middleware + SharedMemoryStore, and when the C helpers are built the same store on its
   ``ctypes`` fallback, ``RATEWARDEN_SHM_NATIVE=0``), batches of ``--concurrency`` concurrent
   requests, rounds interleaving the variants in one process; min and median CPU µs per request,
   the extra over the bare app, and shm extra / memory extra (target <= 1.5).
2. Contention: ``store.hit_now`` on one key in one process, then in two processes at once on the
   same key (same table); aggregate checks/s, rounds interleaved (target: two processes lose less
   than 30 % of one process's throughput).

    PYTHONPATH=src .venv/bin/python scripts/bench_shared_memory.py --requests 4000 --runs 7

Also prints which build ran (pure Python or mypyc-compiled ratewarden).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

import ratewarden
from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores.shared_memory import SharedMemoryStore

ALLOW = 10**9  # a limit never reached: every request allowed
DIRECTORY = tempfile.mkdtemp(prefix="ratewarden-bench-shm-")

SCOPE = {
    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
    "path": "/test", "raw_path": b"/test", "query_string": b"", "root_path": "",
    "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 5000), "server": ("bench", 80),
}


def bare() -> FastAPI:
    app = FastAPI()

    @app.get("/test")
    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    return app


def limited(store: Any) -> FastAPI:
    app = bare()
    app.add_middleware(RateLimitMiddleware, limiter=Limiter(store), rules=[Rule("/test", f"{ALLOW}/min")])
    return app


def shm_store(name: str, native: bool = True, **options: Any) -> SharedMemoryStore:
    """A table in the bench's directory; ``native=False``: on the ``ctypes`` fallback even where
    the C helpers are built (a separate name: each process maps a name once)."""
    saved = os.environ.get("RATEWARDEN_SHM_NATIVE")
    os.environ["RATEWARDEN_SHM_NATIVE"] = "1" if native else "0"
    try:
        return SharedMemoryStore(name, max_keys=65_536, directory=DIRECTORY, **options)
    finally:
        if saved is None:
            del os.environ["RATEWARDEN_SHM_NATIVE"]
        else:
            os.environ["RATEWARDEN_SHM_NATIVE"] = saved


def has_native() -> bool:
    store = shm_store("bench-probe")
    store.unlink()
    return store._segment().native is not None


NATIVE = has_native()
SHM = "middleware + SharedMemoryStore" + (" (C)" if NATIVE else "")
SHM_CTYPES = "middleware + SharedMemoryStore (ctypes)"
VARIANTS: dict[str, Callable[[], FastAPI]] = {
    "bare": bare,
    "middleware + MemoryStore": lambda: limited(MemoryStore()),
    SHM: lambda: limited(shm_store("bench-mw")),
}
if NATIVE:
    VARIANTS[SHM_CTYPES] = lambda: limited(shm_store("bench-mw-ctypes", native=False))


async def drive(app: FastAPI, requests: int, concurrency: int) -> float:
    """Mean CPU µs per request (this process's CPU time: on a shared machine, other processes'
    load changes the wall time far more than the cost measured here)."""
    statuses: dict[int, int] = {}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses[message["status"]] = statuses.get(message["status"], 0) + 1

    async def one() -> None:
        await app(dict(SCOPE), receive, send)  # type: ignore[arg-type]

    start = time.process_time()
    for _ in range(0, requests, concurrency):
        await asyncio.gather(*(one() for _ in range(concurrency)))
    elapsed = time.process_time() - start
    assert set(statuses) == {200}, statuses
    return elapsed / requests * 1e6


async def extra_cost(requests: int, runs: int, concurrency: int) -> None:
    apps = {name: build() for name, build in VARIANTS.items()}
    for app in apps.values():
        await drive(app, 500, concurrency)  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(runs):
        for name, app in apps.items():
            samples[name].append(await drive(app, requests, concurrency))
    print(f"{'variant':40s} {'min µs':>7s} {'med µs':>7s} {'extra min':>9s} {'extra med':>9s}")
    base_min = min(samples["bare"])
    base_med = statistics.median(samples["bare"])
    extras: dict[str, tuple[float, float]] = {}
    for name, values in samples.items():
        extras[name] = (min(values) - base_min, statistics.median(values) - base_med)
        print(f"{name:40s} {min(values):7.2f} {statistics.median(values):7.2f} {extras[name][0]:9.2f} {extras[name][1]:9.2f}")
    mem = extras["middleware + MemoryStore"]
    for name in (SHM, SHM_CTYPES) if NATIVE else (SHM,):
        shm = extras[name]
        which = name.removeprefix("middleware + SharedMemoryStore")
        print(f"shm{which} extra / memory extra: {shm[0] / mem[0]:.2f} (min), {shm[1] / mem[1]:.2f} (median); "
              "target <= 1.5")


HOT = Limit(Rate(ALLOW, 60.0), "gcra")
HOT_KEY = "rw:{hot|client}:gcra"


def hammer(name: str, checks: int, start: Any, out: Any) -> None:
    store = shm_store(name)
    hit = store.hit_now
    keys, limits, costs = [HOT_KEY], [HOT], [1.0]
    hit(keys, limits, costs)
    start.wait()
    t0 = time.perf_counter()
    for _ in range(checks):
        hit(keys, limits, costs)
    out.put((t0, time.perf_counter()))


def throughput(ctx: Any, processes: int, checks: int) -> float:
    """Aggregate checks per second of ``processes`` processes hammering one key."""
    start = ctx.Barrier(processes)
    out = ctx.Queue()
    procs = [ctx.Process(target=hammer, args=("bench-hot", checks, start, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    spans = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    elapsed = max(end for _, end in spans) - min(begin for begin, _ in spans)
    return processes * checks / elapsed


def contention(checks: int, runs: int) -> None:
    ctx = multiprocessing.get_context("fork")
    one: list[float] = []
    two: list[float] = []
    for _ in range(runs):
        one.append(throughput(ctx, 1, checks))
        two.append(throughput(ctx, 2, checks))
    print(f"one hot key, {checks} checks per process, {os.cpu_count()} cores:")
    print(f"  1 process : {min(one):9.0f} min  {statistics.median(one):9.0f} median checks/s")
    print(f"  2 processes: {min(two):9.0f} min  {statistics.median(two):9.0f} median checks/s (aggregate)")
    loss = 1 - statistics.median(two) / statistics.median(one)
    print(f"  throughput lost under contention (median): {loss:.0%}; target < 30%")


def mechanisms(checks: int, runs: int) -> None:
    """The lock choice, measured: one process, one key, ``hit_now`` with the region lock taken as a
    process-shared robust mutex (the default on Linux; through the C helpers when built, and
    through ``ctypes``, the fallback), with ``fcntl.lockf`` on the region's byte
    (the fallback, ``lock="lockf"``), with ``fcntl.flock`` on the whole file (one lock for
    everything, shared with forked children: not used), and with no lock at all (unsafe: the
    floor of the Python work)."""
    import fcntl

    mutex = shm_store("bench-mech-mutex", lock="mutex")
    ctypes_mutex = shm_store("bench-mech-ctypes", native=False, lock="mutex")
    lockf = shm_store("bench-mech-lockf", lock="lockf")
    keys, limits, costs = [HOT_KEY], [HOT], [1.0]
    file_locks = lockf._segment().locks  # the lockf store's FileLocks: its ``lockf`` is swapped below
    real = file_locks.lockf

    def flock(fd: int, cmd: int, length: int = 0, start: int = 0) -> None:
        fcntl.flock(fd, cmd)

    def nolock(fd: int, cmd: int, length: int = 0, start: int = 0) -> None:
        return None

    variants: dict[str, tuple[Any, Any]] = {
        "robust mutex, C helpers" if NATIVE else "robust mutex, ctypes": (mutex, real),
        **({"robust mutex, ctypes (fallback)": (ctypes_mutex, real)} if NATIVE else {}),
        "lockf per region": (lockf, real),
        "flock whole file": (lockf, flock),
        "no lock (unsafe floor)": (lockf, nolock),
        "MemoryStore (reference)": (MemoryStore(), real),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(runs):
        for name, (store, fn) in variants.items():
            if store is lockf:
                file_locks.lockf = fn
            hit = store.hit_now
            t0 = time.process_time()
            for _ in range(checks):
                hit(keys, limits, costs)
            samples[name].append((time.process_time() - t0) / checks * 1e6)
        file_locks.lockf = real
    print("hit_now on one key, CPU µs per check:")
    for name, values in samples.items():
        print(f"  {name:32s} {min(values):6.2f} min {statistics.median(values):6.2f} median")
    mutex.unlink()
    ctypes_mutex.unlink()
    lockf.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--checks", type=int, default=100_000, help="checks per process in the contention test")
    args = parser.parse_args()
    build = "mypyc-compiled" if getattr(ratewarden, "COMPILED", False) else "pure Python"
    helpers = "C helpers built" if NATIVE else "no C helpers (ctypes)"
    print(f"ratewarden {build}, {helpers}; table in {DIRECTORY}")
    asyncio.run(extra_cost(args.requests, args.runs, args.concurrency))
    print()
    contention(args.checks, args.runs)
    print()
    mechanisms(args.checks, args.runs)
    for name in ("bench-mw", "bench-mw-ctypes", "bench-hot"):
        shm_store(name).unlink()


if __name__ == "__main__":
    main()
