"""``ratewarden serve`` as a real process on free loopback ports: workers exact on the shared-memory
default, SIGHUP and file-change reloads (a broken file keeps the old policy), graceful SIGTERM
(exit 0), /healthz, /metrics, start-up errors, and the gRPC server beside HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.bench.services import free_port
from tests.front_door import require_compiled_front
from tests.servers import wait_until

POLICY = """
version = 1

[identity]
sources = ["header:X-API-Key"]
unknown_group = "basic"
anonymous_group = "basic"

[identity.keys]
"pk-alice" = "premium"

[groups.premium]
limits = "100/hour"

[groups.basic]
limits = "{basic}"

[[rules]]
name = "api"
path = "/api/**"
tiered = true
"""

ENVOY = """
domain: cli_test
descriptors:
  - key: api_key
    rate_limit:
      unit: hour
      requests_per_unit: 10
"""


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")  # write then rename, as deploy tools do
    tmp.write_text(text)
    os.replace(tmp, path)


class Serve:
    """One ``ratewarden serve`` process; its JSON log lines are read from a file."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"serve-{self.port}.log"
        argv = [sys.executable, "-m", "ratewarden.cli", "serve", *args, "--http", f"127.0.0.1:{self.port}"]
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if name is None or event.get("event") == name:
                out.append(event)
        return out

    def wait_for(self, name: str, count: int = 1, timeout: float = 20.0) -> list[dict[str, Any]]:
        def seen() -> bool:
            assert self.proc.poll() is None, f"serve exited early:\n{self.log.read_text()}"
            return len(self.events(name)) >= count

        wait_until(seen, timeout, f"{count} {name!r} log events")
        return self.events(name)

    def ready(self, workers: int = 1) -> Serve:
        self.wait_for("worker_started", workers)
        wait_until(lambda: httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200, 20, "/healthz")
        return self

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise AssertionError(f"serve did not stop on SIGTERM:\n{self.log.read_text()}") from None


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Serve] = []

    def start(*args: str) -> Serve:
        server = Serve(tmp_path, *args)
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)
        # a supervisor killed in a test leaves its run's shared-memory table behind
        (Path("/dev/shm") / f"ratewarden-serve-{server.proc.pid}.shm").unlink(missing_ok=True)


async def _checks(url: str, n: int, key: str) -> Counter[int]:
    """``n`` concurrent checks, each on a new connection (so every worker takes some)."""
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=20) as client:
        headers = {"X-Original-URI": "/api/items", "X-API-Key": key}
        answers = await asyncio.gather(*(client.get("/check", headers=headers) for _ in range(n)))
    return Counter(a.status_code for a in answers)


def test_two_workers_exact_on_the_shared_memory_default(tmp_path: Path, serve: Any) -> None:
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    server = serve(str(policy), "--workers", "2").ready(workers=2)
    started = server.events("started")[0]
    assert started["workers"] == 2 and started["store"].startswith("shm://")
    assert len({e["pid"] for e in server.events("worker_started")}) == 2
    assert asyncio.run(_checks(server.url, 150, "pk-alice")) == {200: 100, 429: 50}
    assert asyncio.run(_checks(server.url, 12, "trial-1")) == {200: 5, 429: 7}
    for _ in range(4):  # whichever worker answers, /metrics shows the totals over both
        metrics = httpx.get(f"{server.url}/metrics", headers={"Connection": "close"}).text
        assert 'ratewarden_requests_allowed_total{group="premium",rule="api.premium"} 100.0' in metrics
        assert 'ratewarden_requests_limited_total{group="basic",rule="api.basic"} 7.0' in metrics
        assert "ratewarden_checks_without_store_total" in metrics
    assert server.stop() == 0
    assert server.events("exited")
    table = Path("/dev/shm") / f"ratewarden-{started['store'].removeprefix('shm://')}.shm"
    assert not table.exists()  # the run's table is removed with it


def test_two_workers_on_redis_exact_then_never_unlimited_while_it_is_down(
    tmp_path: Path, serve: Any, redis_standalone: Any
) -> None:
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour").replace('name = "api"', f'name = "serve-cli-{os.getpid()}"'))
    server = serve(str(policy), "--workers", "2", "--store", redis_standalone.url).ready(workers=2)
    assert server.events("started")[0]["store"].startswith("redis://")
    assert asyncio.run(_checks(server.url, 150, "pk-alice")) == {200: 100, 429: 50}
    redis_standalone.stop()
    try:
        wait_until(lambda: httpx.get(f"{server.url}/healthz", timeout=10).status_code == 503, 20, "/healthz 503")
        assert "store unavailable" in httpx.get(f"{server.url}/healthz", timeout=10).text
        down = asyncio.run(_checks(server.url, 300, "trial-down"))
    finally:
        redis_standalone.start()
    # each worker's insurance limiter admits its share of the basic limit (5 // 2): never unlimited, never a 5xx
    assert set(down) <= {200, 429} and 2 <= down[200] <= 4, down
    wait_until(lambda: httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200, 20, "/healthz 200 again")
    assert asyncio.run(_checks(server.url, 8, "trial-back")) == {200: 5, 429: 3}
    assert server.stop() == 0


def test_sighup_reloads_every_worker(tmp_path: Path, serve: Any) -> None:
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    server = serve(str(policy), "--workers", "2", "--watch", "0").ready(workers=2)
    assert asyncio.run(_checks(server.url, 8, "k1")) == {200: 5, 429: 3}
    _write(policy, POLICY.replace("{basic}", "2/hour"))
    os.kill(server.proc.pid, signal.SIGHUP)
    reloads = server.wait_for("reloaded", 2)
    assert {e["reason"] for e in reloads} == {"SIGHUP"} and len({e["pid"] for e in reloads}) == 2
    assert [e.get("groups_changed") for e in reloads] == [["basic"], ["basic"]]  # what the reload changed, named
    assert asyncio.run(_checks(server.url, 8, "k2")) == {200: 2, 429: 6}
    assert server.stop() == 0


def test_file_change_reload_and_a_broken_file_keeps_the_policy(tmp_path: Path, serve: Any) -> None:
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    server = serve(str(policy), "--watch", "0.1").ready()
    _write(policy, POLICY.replace("{basic}", "3/hour"))
    assert server.wait_for("reloaded")[0]["reason"] == "file changed"
    assert asyncio.run(_checks(server.url, 6, "k1")) == {200: 3, 429: 3}
    _write(policy, POLICY.replace("{basic}", "three per hour"))
    rejected = server.wait_for("reload_rejected")[0]
    assert rejected["level"] == "error" and "policy.toml:16: groups.basic.limits" in rejected["error"]
    assert asyncio.run(_checks(server.url, 6, "k2")) == {200: 3, 429: 3}  # the previous policy
    assert httpx.get(f"{server.url}/healthz").text == "ok\n"
    assert server.stop() == 0


def test_healthz_metrics_and_graceful_sigterm(tmp_path: Path, serve: Any) -> None:
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    server = serve(str(policy), "--log-format", "json").ready()
    assert asyncio.run(_checks(server.url, 7, "m1")) == {200: 5, 429: 2}
    health = httpx.get(f"{server.url}/healthz")
    assert health.status_code == 200 and health.text == "ok\n"
    metrics = httpx.get(f"{server.url}/metrics")
    assert metrics.status_code == 200
    assert 'ratewarden_requests_limited_total{group="basic",rule="api.basic"} 2.0' in metrics.text
    assert httpx.get(f"{server.url}/nope").status_code == 404
    assert server.stop() == 0
    names = [e["event"] for e in server.events()]
    assert names.index("stopping") < names.index("worker_stopped") < names.index("exited")
    assert all({"ts", "level", "event", "pid"} <= e.keys() for e in server.events())


SLOW = """
version = 1

[[rules]]
name = "slow"
path = "/slow"
rate = "1/2s"
algorithm = "gcra"
key = "ip"
delay = { max_wait = "5s" }
"""


def test_sigterm_finishes_in_flight_checks(tmp_path: Path, serve: Any) -> None:
    """A check held by a ``delay`` (about 2 s for its turn) is answered 200 after SIGTERM, then exit 0."""
    policy = tmp_path / "slow.toml"
    _write(policy, SLOW)
    server = serve(str(policy)).ready()
    headers = {"X-Original-URI": "/slow"}
    assert httpx.get(f"{server.url}/check", headers=headers).status_code == 200

    async def held_then_term() -> httpx.Response:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            pending = asyncio.create_task(client.get("/check", headers=headers))
            await asyncio.sleep(0.5)  # it is waiting for its turn now
            server.proc.send_signal(signal.SIGTERM)
            return await pending

    answer = asyncio.run(held_then_term())
    assert answer.status_code == 200
    assert server.proc.wait(30) == 0
    names = [e["event"] for e in server.events()]
    assert names.index("stopping") < names.index("worker_stopped")


def test_a_killed_worker_is_replaced_and_counts_survive(tmp_path: Path, serve: Any) -> None:
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    server = serve(str(policy), "--workers", "2").ready(workers=2)
    assert asyncio.run(_checks(server.url, 3, "k1")) == {200: 3}
    victim = server.events("worker_started")[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    exited = server.wait_for("worker_exited")[0]
    assert exited["pid"] == victim and exited["code"] == -signal.SIGKILL
    server.wait_for("worker_started", 3)
    assert asyncio.run(_checks(server.url, 6, "k1")) == {200: 2, 429: 4}  # the shared table kept k1's 3
    assert server.stop() == 0


def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path, serve: Any) -> None:
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    server = serve(str(policy), "--workers", "2").ready(workers=2)
    workers = [e["pid"] for e in server.events("worker_started")]
    server.proc.kill()
    server.proc.wait(10)
    wait_until(lambda: len(server.events("worker_stopped")) == 2, 20, "orphaned workers to stop")
    assert {e["pid"] for e in server.events("worker_stopped")} == set(workers)
    assert all(e["reason"] == "supervisor gone" for e in server.events("stopping"))


def test_a_forwarded_for_header_never_becomes_the_client(tmp_path: Path, serve: Any) -> None:
    """The gateway's X-Real-IP names the client; an X-Forwarded-For the client sent (passed on by a
    gateway) must not replace the loopback caller's address before the trusted-proxy rule runs."""
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    server = serve(str(policy)).ready(workers=1)
    statuses = Counter(
        httpx.get(
            f"{server.url}/check",
            headers={"X-Original-URI": "/api/items", "X-Real-IP": "203.0.113.7", "X-Forwarded-For": f"198.51.100.{i}"},
        ).status_code
        for i in range(12)
    )
    assert statuses == {200: 5, 429: 7}
    assert server.stop() == 0


def test_no_metrics(tmp_path: Path, serve: Any) -> None:
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    server = serve(str(policy), "--workers", "2", "--no-metrics").ready(workers=2)
    answer = httpx.get(f"{server.url}/metrics")
    assert answer.status_code == 404 and "--no-metrics" in answer.json()["error"]
    assert server.stop() == 0


def _spop(kind: int, stream: int, frame: int, payload: bytes) -> bytes:
    """A HAProxy-side SPOP frame (FIN set), built by hand from SPOE.txt."""
    from ratewarden.serve.spop import encode_varint

    body = bytes((kind,)) + (1).to_bytes(4, "big") + encode_varint(stream) + encode_varint(frame) + payload
    return len(body).to_bytes(4, "big") + body


def _spop_string(text: str) -> bytes:
    from ratewarden.serve.spop import encode_varint

    return encode_varint(len(text)) + text.encode()


def _read_spop(sock: socket.socket) -> tuple[int, bytes]:
    """(frame type, the rest) of the next frame; (0, b"") when the peer closed the connection."""
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return 0, b""
        head += chunk
    length = int.from_bytes(head, "big")
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return body[0], body[1:]


@pytest.mark.parametrize("front", ["python", "compiled"])
def test_spoe_agent_answers_and_ends_its_connections_on_sigterm(tmp_path: Path, serve: Any, front: str) -> None:
    """``--spoe`` (on each ``--spoe-front``): a HAProxy-like client gets AGENT-HELLO and an ACK for its
    check; on SIGTERM the service ends the connection it keeps open and exits 0, without a traceback."""
    from ratewarden.serve.spop import encode_varint

    if front == "compiled":
        require_compiled_front()
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    spoe_port = free_port()
    server = serve(str(policy), "--spoe", f"127.0.0.1:{spoe_port}", "--spoe-front", front).ready()
    started = server.events("started")[0]
    assert (started["spoe"], started["spoe_front"]) == (f"127.0.0.1:{spoe_port}", front)
    hello = (_spop_string("supported-versions") + b"\x08" + _spop_string("2.0")
             + _spop_string("max-frame-size") + b"\x03" + encode_varint(16380)
             + _spop_string("capabilities") + b"\x08" + _spop_string("pipelining"))
    check = (_spop_string("check") + bytes((2,)) + _spop_string("method") + b"\x08" + _spop_string("GET")
             + _spop_string("uri") + b"\x08" + _spop_string("/api/items"))
    with socket.create_connection(("127.0.0.1", spoe_port), timeout=10) as sock:
        sock.sendall(_spop(1, 0, 0, hello))
        assert _read_spop(sock)[0] == 101  # AGENT-HELLO
        sock.sendall(_spop(3, 5, 1, check))
        kind, rest = _read_spop(sock)
        assert kind == 103 and b"status" in rest  # the ACK, with its variables
        assert server.stop() == 0
        assert _read_spop(sock) == (0, b"")  # the service closed the connection
    assert "Traceback" not in server.log.read_text()


def test_version_names_the_spoe_front_door_and_compiled_needs_the_extension(tmp_path: Path) -> None:
    """``--version`` names the SPOE agent ``--spoe-front`` runs; without ``ratewarden._front``, the
    default falls back to the Python agent and says why, and ``--spoe-front compiled`` exits 2 with
    the reason, no traceback."""
    version = [sys.executable, "-m", "ratewarden.cli", "serve", "--version"]
    assert "SPOE front door: python (asyncio); not compiled: --spoe-front python" in subprocess.run(
        [*version[:-1], "--spoe-front", "python", "--version"], capture_output=True, text=True, timeout=60).stdout
    policy = tmp_path / "policy.toml"
    _write(policy, POLICY.replace("{basic}", "5/hour"))
    code = "import sys; sys.modules['ratewarden._front'] = None; from ratewarden.cli import main; sys.exit(main(sys.argv[1:]))"
    base = [sys.executable, "-c", code, "serve", str(policy), "--http", "127.0.0.1:1", "--spoe", "127.0.0.1:2"]
    refused = subprocess.run([*base, "--spoe-front", "compiled"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused
    assert refused.stderr.startswith("ratewarden serve: --spoe-front compiled: ratewarden._front does not import")
    assert "Traceback" not in refused.stderr
    none = subprocess.run([*base, "--spoe-front", "compiled", "--version"], capture_output=True, text=True, timeout=60)
    assert "SPOE front door: none (--spoe-front compiled: ratewarden._front does not import" in none.stdout
    fallback = subprocess.run([*base, "--version"], capture_output=True, text=True, timeout=60)
    assert "SPOE front door: python (asyncio); not compiled: ratewarden._front does not import" in fallback.stdout
    require_compiled_front()
    compiled = subprocess.run([*version[:-1], "--spoe-front", "compiled", "--version"], capture_output=True, text=True,
                              timeout=60)
    assert "SPOE front door: compiled (tokio in ratewarden._front" in compiled.stdout
    default = subprocess.run(version, capture_output=True, text=True, timeout=60)
    assert "SPOE front door: compiled (tokio in ratewarden._front" in default.stdout  # auto, where it imports


def test_start_up_errors_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text(POLICY.replace("{basic}", "lots"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "ratewarden.cli", "serve", *args, "--http", f"127.0.0.1:{free_port()}"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)

    bad_policy = run(str(broken))
    assert bad_policy.returncode == 2 and "broken.toml:16: groups.basic.limits" in bad_policy.stderr
    missing = run(str(tmp_path / "missing.toml"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    zero = run(str(broken), "--workers", "0")
    assert zero.returncode == 2
    address = run(str(broken), "--grpc", "nowhere")
    assert address.returncode == 2 and "HOST:PORT" in address.stderr
    fine = tmp_path / "fine.toml"
    fine.write_text(POLICY.replace("{basic}", "5/hour"))
    store = run(str(fine), "--store", "bogus://somewhere")
    assert store.returncode == 2 and "unsupported store URL" in store.stderr
    envoy = tmp_path / "envoy.yaml"
    envoy.write_text(ENVOY)
    spoe_alone = run(str(envoy), "--spoe", f"127.0.0.1:{free_port()}")  # SPOE answers with a policy file
    assert spoe_alone.returncode == 2 and "--spoe" in spoe_alone.stderr and "policy file" in spoe_alone.stderr
    spoe_front = run(str(fine), "--spoe", f"127.0.0.1:{free_port()}", "--spoe-front", "rust")
    assert spoe_front.returncode == 2 and "--spoe-front" in spoe_front.stderr
    spoe_address = run(str(fine), "--spoe", "somewhere")
    assert spoe_address.returncode == 2 and "--spoe" in spoe_address.stderr and "HOST:PORT" in spoe_address.stderr


@pytest.mark.parametrize(
    ("blocked", "file", "named"),
    [("uvicorn", "policy.toml", "uvicorn"), ("grpc", "envoy.yaml", "grpcio"), ("yaml", "envoy.yaml", "PyYAML")],
)
def test_without_the_serve_extra_exit_2_naming_what_to_install(
    tmp_path: Path, blocked: str, file: str, named: str
) -> None:
    """A package of the ``serve`` extra that cannot be imported is one line naming it and the extra, exit
    status 2, before anything starts: no traceback from a worker, no "started" line."""
    (tmp_path / "policy.toml").write_text(POLICY.replace("{basic}", "5/hour"))
    (tmp_path / "envoy.yaml").write_text(ENVOY)
    code = f"import sys; sys.modules[{blocked!r}] = None; from ratewarden.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "serve", str(tmp_path / file), "--http", f"127.0.0.1:{free_port()}",
            "--grpc", f"127.0.0.1:{free_port()}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert named in result.stderr and "pip install 'ratewarden[serve]'" in result.stderr
    assert "Traceback" not in result.stderr and "started" not in result.stderr


def test_the_policy_settings_store_is_used(tmp_path: Path, serve: Any) -> None:
    name = f"serve-cli-settings-{os.getpid()}"
    policy = tmp_path / "policy.toml"
    settings = f'version = 1\n\n[settings]\nstore = "shm://{name}"\n'
    _write(policy, POLICY.replace("version = 1\n", settings).replace("{basic}", "5/hour"))
    try:
        server = serve(str(policy), "--workers", "2").ready(workers=2)
        assert server.events("started")[0]["store"] == f"shm://{name}"
        assert asyncio.run(_checks(server.url, 12, "t1")) == {200: 5, 429: 7}
        assert server.stop() == 0
    finally:
        (Path("/dev/shm") / f"ratewarden-{name}.shm").unlink(missing_ok=True)


def test_envoy_config_serves_grpc_and_json(tmp_path: Path, serve: Any) -> None:
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("ratewarden.serve.grpc")
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    from google.protobuf import json_format

    config = tmp_path / "envoy"
    config.mkdir()
    (config / "config.yaml").write_text(ENVOY)
    grpc_port = free_port()
    server = serve(str(config), "--workers", "2", "--grpc", f"127.0.0.1:{grpc_port}").ready(workers=2)
    request = {"domain": "cli_test", "descriptors": [{"entries": [{"key": "api_key", "value": "k1"}]}]}
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        message = json_format.ParseDict(request, rls_pb2.RateLimitRequest())
        codes = Counter(stub.ShouldRateLimit(message, timeout=10).overall_code for _ in range(8))
    assert codes == {rls_pb2.RateLimitResponse.OK: 8}
    answers = [httpx.post(f"{server.url}/json", json=request).status_code for _ in range(4)]
    assert Counter(answers) == {200: 2, 429: 2}  # one count shared by gRPC, HTTP and both workers
    assert server.stop() == 0


def test_envoy_config_reloads_on_sighup_and_keeps_a_broken_one(tmp_path: Path, serve: Any) -> None:
    pytest.importorskip("ratewarden.serve.grpc")
    config = tmp_path / "envoy.yaml"
    _write(config, ENVOY)
    server = serve(str(config), "--watch", "0", "--grpc", f"127.0.0.1:{free_port()}").ready()

    def json_checks(value: str, n: int) -> Counter[int]:
        request = {"domain": "cli_test", "descriptors": [{"entries": [{"key": "api_key", "value": value}]}]}
        return Counter(httpx.post(f"{server.url}/json", json=request).status_code for _ in range(n))

    assert json_checks("a", 12) == {200: 10, 429: 2}
    _write(config, ENVOY.replace("requests_per_unit: 10", "requests_per_unit: 3"))
    os.kill(server.proc.pid, signal.SIGHUP)
    assert server.wait_for("reloaded")[0]["kind"] == "envoy"
    assert json_checks("b", 5) == {200: 3, 429: 2}
    _write(config, ENVOY.replace("requests_per_unit: 10", "requests_per_unit: 3\n      burst: 9"))
    os.kill(server.proc.pid, signal.SIGHUP)
    rejected = server.wait_for("reload_rejected")[0]
    assert rejected["kind"] == "envoy" and "envoy.yaml:" in rejected["error"] and "burst" in rejected["error"]
    assert json_checks("c", 5) == {200: 3, 429: 2}  # the previous configuration
    assert server.stop() == 0


# -- docs/serve.md: its examples run as written ------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_docs_python_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(DOC.parents[1])
    blocks = _blocks("python")
    assert blocks
    for code in blocks:
        exec(compile(code, str(DOC), "exec"), {"__name__": "__main__"})


def _shell(script: str, cwd: Path) -> str:
    """A docs shell block with its ports replaced by free ones, run with the venv's commands."""
    http, grpc_port = free_port(), free_port()
    script = script.replace("127.0.0.1:8080", f"127.0.0.1:{http}").replace("127.0.0.1:8081", f"127.0.0.1:{grpc_port}")
    script = script.replace("sleep 2", f"for i in $(seq 100); do curl -sf http://127.0.0.1:{http}/healthz >/dev/null && break; sleep 0.1; done")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-c", script + "\nwait\n"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_docs_try_it_runs() -> None:
    script = next(b for b in _blocks("bash") if "examples/policy.toml" in b)
    out = _shell(script, DOC.parents[1]).splitlines()
    assert out[0] == "ok" and out[1] == "200"
    answer = json.loads(out[2])
    assert answer["allowed"] is True and answer["group"] == "basic" and answer["limit"] == 5


def test_docs_envoy_json_runs(tmp_path: Path) -> None:
    pytest.importorskip("ratewarden.serve.grpc")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "mongo.yaml").write_text(_blocks("yaml")[0])
    script = next(b for b in _blocks("bash") if "/json" in b)
    answer = json.loads(_shell(script, tmp_path).splitlines()[0])
    assert answer["overallCode"] == "OK"


def test_files_are_sorted_into_the_policy_and_envoy_configurations(tmp_path: Path) -> None:
    from ratewarden.errors import ConfigurationError
    from ratewarden.serve.config import envoy_files, parse_address

    root = DOC.parents[1]
    (tmp_path / "envoy").mkdir()
    (tmp_path / "envoy" / "a.yaml").write_text(ENVOY)
    (tmp_path / "envoy" / "notes.txt").write_text("not read")
    single = tmp_path / "b.yml"
    single.write_text(ENVOY.replace("cli_test", "other"))
    policy, envoy = envoy_files([root / "examples" / "policy.yaml", tmp_path / "envoy", single])
    assert policy == root / "examples" / "policy.yaml"
    assert envoy == [tmp_path / "envoy" / "a.yaml", single]
    with pytest.raises(ConfigurationError, match="only one ratewarden policy file"):
        envoy_files([root / "examples" / "policy.yaml", root / "examples" / "policy.toml"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigurationError, match=r"no \.yaml or \.yml file"):
        envoy_files([tmp_path / "empty"])
    assert parse_address("[::1]:9000", "--http") == ("::1", 9000)
    assert parse_address(":8080", "--http") == ("0.0.0.0", 8080)
    with pytest.raises(ConfigurationError, match="HOST:PORT"):
        parse_address("127.0.0.1:99999", "--http")
