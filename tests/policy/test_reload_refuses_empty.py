"""Issue 28, finding 4: a policy file that limits nothing (emptied, or cut short while it was being
written) is refused at start-up and on reload by every door unless it says ``allow_empty = true``;
the watcher reads a changed file only once it has stopped changing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden import Limiter, MemoryStore
from ratewarden.bench.services import free_port
from ratewarden.policy import PolicyError, PolicyMiddleware, PolicyReloader, WSGIPolicyMiddleware, load_policy
from ratewarden.policy.schema import Policy
from tests.policy.apps import build_app, client
from tests.policy.test_wsgi_policy import hello, statuses

POLICY = """version = 1
[[rules]]
path = "/health"
bypass = true
[[rules]]
name = "api"
path = "/api/**"
rate = "{rate}"
key = "header:X-Client"
"""
CUT = POLICY[: POLICY.index("[[rules]]\nname")]  # cut at a line boundary: the bypass rule alone


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


async def _asgi_statuses(app: Any, n: int, who: str) -> list[int]:
    async with client(app) as http:
        return [(await http.get("/api/x", headers={"X-Client": who})).status_code for _ in range(n)]


@pytest.mark.parametrize("emptied", ["", "# being written\n", CUT], ids=["truncated", "comment only", "cut after a bypass rule"])
async def test_asgi_watcher_keeps_the_policy_when_the_file_limits_nothing(tmp_path: Path, emptied: str) -> None:
    path = tmp_path / "policy.toml"
    _write(path, POLICY.replace("{rate}", "2/min"))
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=path, watch=0.02)
    try:
        assert await _asgi_statuses(app, 3, "a") == [200, 200, 429]
        path.write_text(emptied)  # `: > policy.toml`, or a writer caught mid-file
        reloader = app.reloader
        assert reloader is not None
        await asyncio.to_thread(_wait_for, lambda: reloader.failures >= 1)
        assert reloader.reloads == 0
        assert "so it limits nothing" in str(reloader.last_error) and str(path) in str(reloader.last_error)
        assert await _asgi_statuses(app, 2, "a") == [429, 429]  # the old policy is in force
    finally:
        app.close()


def test_wsgi_reload_keeps_the_policy_when_the_file_is_emptied(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _write(path, POLICY.replace("{rate}", "2/min"))
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), policy=path, watch=0.02)
    try:
        assert statuses(app, "/api/x", 3, headers={"X-Client": "a"}) == [200, 200, 429]
        path.write_text("")
        reloader = app.reloader
        assert reloader is not None
        _wait_for(lambda: reloader.failures >= 1)
        assert app.reload() is False and "has no rules" in str(reloader.last_error)
        assert statuses(app, "/api/x", 2, headers={"X-Client": "a"}) == [429, 429]
    finally:
        app.close()


@pytest.mark.parametrize("door", ["asgi", "wsgi"])
def test_start_up_refuses_a_policy_that_limits_nothing_unless_it_allows_it(tmp_path: Path, door: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("")
    make: Any = (lambda p: PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=p)) if door == "asgi" else (
        lambda p: WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), policy=p)
    )
    with pytest.raises(PolicyError, match="has no rules, so it limits nothing"):
        make(path)
    path.write_text(CUT)
    with pytest.raises(PolicyError, match="has only bypass rules"):
        make(path)
    path.write_text("[settings]\nallow_empty = true\n")
    app = make(path)
    try:
        assert app.policy is not None and app.policy.rules == []
    finally:
        app.close()


def test_load_policy_allow_empty_argument(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("rules: []\n")
    with pytest.raises(PolicyError, match="allow_empty = true under \\[settings\\]"):
        load_policy(path)
    assert load_policy(path, allow_empty=True).rules == []


def test_the_watcher_reads_a_changed_file_only_once_it_has_settled(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _write(path, POLICY.replace("{rate}", "1000/min"))
    applied: list[Policy] = []
    reloader = PolicyReloader(path, applied.append, interval=0.01, settle=0.2)
    reloader.load()
    path.write_text(POLICY.replace("{rate}", "3/min"))
    assert reloader.check() is None and len(applied) == 1  # just changed: not read yet
    time.sleep(0.25)
    with path.open("a") as f:  # still being written: its size changes, so the wait starts again
        f.write("# more\n")
    assert reloader.check() is None and len(applied) == 1
    time.sleep(0.25)
    assert reloader.check() is True and len(applied) == 2  # unchanged across 0.2 s: read
    assert str(applied[-1].rules[1].limits[0].rate) == "3/minute"
    assert reloader.check() is None


def test_serve_refuses_an_emptied_policy_and_an_empty_one_at_start_up(tmp_path: Path) -> None:
    from tests.serve.test_serve_cli import Serve

    path = tmp_path / "policy.toml"
    path.write_text("")
    argv = [sys.executable, "-m", "ratewarden.cli", "serve", str(path), "--http", f"127.0.0.1:{free_port()}"]
    empty = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and "has no rules, so it limits nothing" in empty.stderr

    _write(path, POLICY.replace("{rate}", "2/hour"))
    server = Serve(tmp_path, str(path), "--watch", "0.05").ready()
    try:
        def checks(n: int) -> Counter[int]:
            headers = {"X-Original-URI": "/api/items", "X-Client": "c"}
            with httpx.Client(base_url=server.url, timeout=20) as http:
                return Counter(http.get("/check", headers=headers).status_code for _ in range(n))

        assert checks(3) == {200: 2, 429: 1}
        path.write_text("")
        rejected = server.wait_for("reload_rejected")[0]
        assert rejected["level"] == "error" and "has no rules, so it limits nothing" in rejected["error"]
        assert not server.events("reloaded")
        assert checks(2) == {429: 2}  # the old policy is in force
        assert server.stop() == 0
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(10)


def test_django_policy_setting_refuses_an_empty_file(tmp_path: Path) -> None:
    from ratewarden.django import SettingsError, load_config

    path = tmp_path / "policy.toml"
    path.write_text("")
    with pytest.raises(SettingsError, match=r"POLICY.*has no rules, so it limits nothing"):
        load_config({"POLICY": str(path)})
