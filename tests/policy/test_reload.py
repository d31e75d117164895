"""Reloads: on file change under load without a failed request, on SIGHUP and on an admin call;
a broken file is rejected and the previous policy stays."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path

from ratewarden import Limiter, MemoryStore
from ratewarden.policy import PolicyMiddleware

from .apps import build_app, client

POLICY = """
version = 1
[[rules]]
name = "api"
path = "/api/**"
rate = "{rate}"
key = "header:X-Client"
"""


def _write(path: Path, rate: str) -> None:
    # Write then rename, as deploy tools do, so the watcher never reads half a file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(POLICY.replace("{rate}", rate))
    os.replace(tmp, path)


async def _wait_for(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_reload_under_load_changes_limits_without_failures(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _write(path, "1000/min")
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=path, watch=0.02)
    statuses: Counter[int] = Counter()
    stop = asyncio.Event()

    async def traffic(http, n: int) -> None:  # type: ignore[no-untyped-def]
        while not stop.is_set():
            r = await http.get("/api/x", headers={"X-Client": f"bg-{n}"})
            statuses[r.status_code] += 1
            # A real server's loop waits on sockets between requests; a loop that never blocks
            # (in-process transport + sleep(0)) can starve the watcher thread of the GIL.
            await asyncio.sleep(0.001)

    try:
        async with client(app) as http:
            workers = [asyncio.create_task(traffic(http, n)) for n in range(8)]
            await asyncio.sleep(0.1)
            _write(path, "3/min")
            await _wait_for(lambda: app.reloader is not None and app.reloader.reloads >= 1)
            after = Counter([(await http.get("/api/x", headers={"X-Client": "fresh"})).status_code for _ in range(5)])
            await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*workers)
    finally:
        app.close()
    assert after == {200: 3, 429: 2}
    assert set(statuses) <= {200, 429} and statuses[200] > 0
    assert sum(statuses.values()) > 50


async def test_broken_file_is_rejected_and_old_policy_stays(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _write(path, "2/min")
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=path)
    path.write_text(POLICY.replace("{rate}", "2/fortnight"))
    assert app.reload() is False
    assert app.reloader is not None and app.reloader.last_error is not None
    message = str(app.reloader.last_error)
    assert f"{path}:6: rules[0].rate: invalid rate '2/fortnight'" in message
    async with client(app) as http:
        got = Counter([(await http.get("/api/x", headers={"X-Client": "c"})).status_code for _ in range(4)])
    assert got == {200: 2, 429: 2}
    path.write_text("version = 1\n[[rules]\n")
    assert app.reload() is False
    assert "invalid TOML" in str(app.reloader.last_error)
    _write(path, "1/min")
    assert app.reload() is True and app.reloader.last_error is None
    async with client(app) as http:
        got = Counter([(await http.get("/api/x", headers={"X-Client": "d"})).status_code for _ in range(3)])
    assert got == {200: 1, 429: 2}


async def test_sighup_reloads(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _write(path, "9/min")
    previous = signal.getsignal(signal.SIGHUP)
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=path, sighup=True)
    try:
        # Same size and a restored mtime: only the signal can reveal the change.
        stat = path.stat()
        _write(path, "1/min")
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        os.kill(os.getpid(), signal.SIGHUP)
        await _wait_for(lambda: app.reloader is not None and app.reloader.reloads >= 1)
        async with client(app) as http:
            got = Counter([(await http.get("/api/x", headers={"X-Client": "e"})).status_code for _ in range(2)])
        assert got == {200: 1, 429: 1}
    finally:
        signal.signal(signal.SIGHUP, previous)
        app.close()
