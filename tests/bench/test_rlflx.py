"""rate-limiter-flexible behind fastify (seed 001's subject) as live rows: the Node app's answers on a
real redis-server, the skip with the reason where Node, npm or Valkey is missing, the install into the
cache, what the package carries, and one short real run of ``ratewarden bench --rlflx``."""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from ratewarden.bench import rlflx
from ratewarden.bench.adapters import LIBRARIES, OPT_IN, StoreSpec, Unsupported, load
from ratewarden.bench.scenarios import SCENARIOS, Scenario
from ratewarden.cli import bench as cli
from ratewarden.cli import bench_plan
from tests.servers import RedisStandalone, redis_cmd

ROOT = Path(__file__).resolve().parents[2]
HAVE_NODE = shutil.which("node") is not None and shutil.which("npm") is not None
needs_node = pytest.mark.skipif(not HAVE_NODE, reason="node and npm are not installed")
needs_wrk = pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")


def _bin_without_node(tmp_path: Path, **scripts: str) -> str:
    """A PATH of one folder: wrk and redis-cli (when installed) and the given fake executables, no node."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    for tool in ("wrk", "redis-cli"):
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    for name, body in scripts.items():
        (folder / name).write_text("#!/bin/sh\n" + body + "\n")
        (folder / name).chmod(0o755)
    return str(folder)


def _get(url: str, key: str = "") -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers={"X-Client-ID": key} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_the_node_rows_are_opt_in_and_in_process_scenarios_say_why_they_skip() -> None:
    assert set(rlflx.PEERS) <= OPT_IN & set(LIBRARIES)
    with pytest.raises(Unsupported, match="live scenarios only"):
        load("rlflx-ioredis")(SCENARIOS["http.high"], StoreSpec("redis", "redis://127.0.0.1:6379/0")).build()


def _plan(tmp_path: Path, *argv: str) -> tuple[list[str], list[str], list[str], list[int] | None]:
    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    planned = bench_plan.plan(parser.parse_args(["bench", *argv, "--out", str(tmp_path)]))
    assert not isinstance(planned, str), planned
    opts = planned[0]
    return [s.key for s in opts.scenarios], opts.libraries, opts.stores, opts.concurrency


def test_make_bench_and_the_full_plan_leave_the_node_rows_out_and_rlflx_asks_for_them(tmp_path: Path) -> None:
    for argv in (("--quick",), (), ("--scenario", "live.light")):
        assert not set(_plan(tmp_path, *argv)[1]) & OPT_IN, argv
    scenarios, libraries, stores, levels = _plan(tmp_path, "--rlflx")
    assert scenarios == ["live.light", "live.heavy"] and stores == ["redis", "redis-cluster"]
    assert libraries == ["ratewarden", "rlflx-ioredis", "rlflx-iovalkey", "rlflx-glide", "bare", "fastify-bare"]
    assert levels == [50, 100, 500]
    assert _plan(tmp_path, "--rlflx", "--quick", "--store", "redis", "--concurrency", "20")[1:] == (
        libraries, ["redis"], [20])


def test_the_package_carries_the_app_and_its_lock_and_never_node_modules() -> None:
    lock = json.loads((rlflx.NODE_DIR / "package-lock.json").read_text())
    wanted = json.loads((rlflx.NODE_DIR / "package.json").read_text())["dependencies"]
    for name, version in wanted.items():
        assert version[0].isdigit(), f"{name} {version}: pinned exactly, not a range"
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
    pyproject = (ROOT / "pyproject.toml").read_text()
    # exact file names: no pattern of the package data reaches into a node_modules folder
    assert '"bench/node/app.js", "bench/node/package.json", "bench/node/package-lock.json",' in pyproject
    assert pyproject.count("bench/node/") == 3
    assert "prune src/ratewarden/bench/node/node_modules" in (ROOT / "MANIFEST.in").read_text()
    assert "node_modules/" in (ROOT / ".gitignore").read_text().splitlines()
    if os.environ.get("RATEWARDEN_EXPECT_INSTALLED") == "1":  # make test's wheel passes
        files = {str(f) for f in metadata.files("ratewarden") or []}
        assert {"ratewarden/bench/node/app.js", "ratewarden/bench/node/package-lock.json"} <= files
        assert not any("node_modules" in f for f in files)


def test_without_node_on_path_the_row_is_skipped_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _bin_without_node(tmp_path))
    with pytest.raises(Unsupported, match=r"node not found on PATH: install Node\.js 20"):
        rlflx.install()
    monkeypatch.setenv("PATH", _bin_without_node(tmp_path / "old", node="echo v18.19.0", npm="exit 0"))
    with pytest.raises(Unsupported, match=r"node v18\.19\.0 is older than the 20"):
        rlflx.require_node()


def test_a_failed_npm_ci_skips_the_row_and_leaves_no_half_install(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", _bin_without_node(tmp_path, node="echo v20.1.0",
                                                 npm="echo 'npm error 404 Not Found' >&2; exit 1"))
    with pytest.raises(Unsupported, match="npm ci failed \\(exit 1\\): npm error 404 Not Found"):
        rlflx.install()
    assert list((tmp_path / "cache" / "ratewarden" / "node").iterdir()) == []


def test_valkey_only_limiters_are_skipped_on_redis_with_the_reason(redis_standalone: RedisStandalone) -> None:
    spec = StoreSpec("redis", redis_standalone.url)
    assert rlflx.store_problem("ioredis", spec) == ""
    for client in ("iovalkey", "valkey-glide"):
        problem = rlflx.store_problem(client, spec)
        assert "calls server.call, which needs Valkey 8 or later; this store is redis " in problem, problem
        assert "--redis-url" in problem
    assert "not memory" in rlflx.store_problem("ioredis", StoreSpec("memory"))


@pytest.fixture(scope="module")
def modules() -> Path:
    if not HAVE_NODE:
        pytest.skip("node and npm are not installed")
    try:
        return rlflx.install()
    except Unsupported as exc:  # no registry here: nothing to run
        pytest.skip(str(exc))


@pytest.fixture
def app(modules: Path, redis_standalone: RedisStandalone) -> Iterator[rlflx.NodeServer]:
    redis_cmd(redis_standalone.port, "FLUSHDB")
    scenario = Scenario("t.rlflx", "t", "5 per minute", 5, 60, 0, "live", identity="header")
    server = rlflx.NodeServer("rlflx-ioredis", scenario, StoreSpec("redis", redis_standalone.url), None)
    with server:
        yield server


@needs_node
def test_the_app_answers_429_past_the_limit_and_counts_exactly(app: rlflx.NodeServer,
                                                               redis_standalone: RedisStandalone) -> None:
    codes = [_get(app.url + "/test", "alice")[0] for _ in range(8)]
    assert codes == [200] * 5 + [429] * 3
    status, headers, body = _get(app.url + "/heavy", "alice")
    assert status == 429 and json.loads(body)["status"] == "rate_limited"
    assert {k.lower(): v for k, v in headers.items()}["x-ratelimit-remaining"] == "0"
    assert 1 <= int(headers["retry-after"]) <= 60
    status, _, body = _get(app.url + "/heavy", "bob")  # another key: its own 5
    assert status == 200 and json.loads(body)["sum"] > 0
    stats = json.loads(app.get("/__bench__/stats"))
    assert stats["admitted"] == 6 and stats["errors"] == 0
    # rate-limiter-flexible's own counter in the same Redis: every consume, 429s included
    assert redis_cmd(redis_standalone.port, "GET", "rlflx:alice") == "9"
    assert redis_cmd(redis_standalone.port, "GET", "rlflx:bob") == "1"


@needs_node
@needs_wrk
def test_bench_rlflx_runs_the_row_beside_ratewarden_end_to_end(modules: Path, redis_standalone: RedisStandalone,
                                                               tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "ratewarden.cli", "bench", "--rlflx", "--scenario", "live.light", "--store",
            "redis", "--redis-url", redis_standalone.url, "--library",
            "ratewarden,rlflx-ioredis,rlflx-iovalkey,fastify-bare",
            "--concurrency", "20", "--duration", "1", "--iterations", "1", "--warmup", "0", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    results = json.loads((out / "results.json").read_text())
    rows = {r["library"]: r["summary"] for r in results["results"] if r["summary"]}
    peer = rows["rlflx-ioredis"]
    assert (peer["admitted"], peer["limit"], peer["correct"], peer["store"]) == (100, 100, True, "redis")
    assert peer["rps"] > 0 and peer["throttled"] > 0
    assert rows["ratewarden"]["admitted"] == 100
    # x bare: against the same fastify app without a limiter, never the Python bare app
    assert peer["vs_bare"] == pytest.approx(peer["rps"] / rows["fastify-bare"]["rps"])
    assert rows["fastify-bare"]["limit"] is None and rows["fastify-bare"]["store"] == "none"
    skipped = {r["library"]: r["skipped"] for r in results["results"] if r["skipped"]}
    assert "needs Valkey 8 or later" in skipped["rlflx-iovalkey"]
    assert "rate-limiter-flexible rows" in results["meta"]["method"]
    with (out / "summary.csv").open() as f:
        assert "rlflx-ioredis" in {r["library"] for r in csv.DictReader(f)}
    assert "rate-limiter-flexible rows" in (out / "report.md").read_text()
    assert "rlflx-ioredis" in (out / "report.html").read_text()


@needs_wrk
def test_bench_rlflx_without_node_skips_the_rows_with_the_reason(redis_standalone: RedisStandalone,
                                                                 tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "ratewarden.cli", "bench", "--rlflx", "--scenario", "live.light", "--store",
            "redis", "--redis-url", redis_standalone.url, "--library", "rlflx-ioredis", "--concurrency", "10",
            "--duration", "1", "--iterations", "1", "--warmup", "0", "--out", str(out)]
    env = {**os.environ, "PATH": _bin_without_node(tmp_path)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    assert "node not found on PATH" in done.stdout + done.stderr
    skipped = [r for r in json.loads((out / "results.json").read_text())["results"] if r["skipped"]]
    assert [s["library"] for s in skipped] == ["rlflx-ioredis"]
    assert skipped[0]["skipped"].startswith("node not found on PATH: install Node.js 20 or later")
