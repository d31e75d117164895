"""Real nginx and HAProxy, run from the shipped configurations, limiting through a real
``ratewarden serve`` in front of a small backend, all on free loopback ports.

Seed 003's tiers are held exactly per API key, with the rate-limit headers on every answer, and
the service going down mid-traffic gives each gateway's documented answer (503, fail closed).
The docs show the shipped files as they are.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ratewarden.bench.services import free_port
from ratewarden.errors import ArgumentError
from ratewarden.serve.gateways import DEFAULT_PORTS, config_text, names, write_configs
from tests.front_door import require_compiled_front
from tests.servers import HOST, wait_until

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "gateways"
RATEWARDEN = [sys.executable, "-m", "ratewarden.cli"]

# Seed 003's groups, with limits low enough that basic and standard are limited by one burst.
POLICY = """\
version = 1

[identity]
sources = ["header:X-API-Key", "bearer", "query:api_key"]
unknown_group = "basic"
anonymous_group = "basic"

[identity.keys]
"pk-premium" = "premium"
"sk-standard" = "standard"
"bk-basic" = "basic"
"ik-bulk" = "bulk"

[groups.bulk]
limits = "1000000/day"

[groups.premium]
limits = "40/day"

[groups.standard]
limits = "20/day"

[groups.basic]
limits = "8/day"

[[rules]]
name = "api"
path = "/api/**"
tiered = true
"""

#: API key -> (group, limit). "trial-7" is unknown: basic, on its own count; it is sent as a bearer
#: token, the others in X-API-Key.
KEYS = {
    "pk-premium": ("premium", 40),
    "sk-standard": ("standard", 20),
    "bk-basic": ("basic", 8),
    "trial-7": ("basic", 8),
}
PER_KEY = 30  # concurrent requests per key: premium passes, standard and basic are limited

# haproxy-spoe: HAProxy asking over SPOE (haproxy-spoe.cfg); haproxy-spoe-compiled: the same, answered by the
# compiled SPOE front door (--spoe-front compiled)
GATEWAYS = ("nginx", "haproxy", "haproxy-spoe", "haproxy-spoe-compiled")
SPOE_GATEWAYS = ("haproxy-spoe", "haproxy-spoe-compiled")


# --- the pieces --------------------------------------------------------------------------------


class _Backend(BaseHTTPRequestHandler):
    """The app behind the gateway: 200 and the request line, for any method."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = f"backend {self.command} {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = _answer


@contextlib.contextmanager
def backend() -> Iterator[int]:
    server = ThreadingHTTPServer((HOST, 0), _Backend)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _get(port: int, path: str, timeout: float = 2.0) -> int:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


class Process:
    """A child process in its own session, its output in ``log``."""

    def __init__(self, argv: list[str], log: Path, cwd: Path) -> None:
        self.argv = argv
        self.log = log
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise RuntimeError(f"{self.argv[0]} exited ({code}):\n{self.log.read_text(errors='replace')[-3000:]}")
        return True

    def pause(self) -> None:
        """SIGSTOP: its sockets stay open, nothing answers; returns once the kernel says stopped."""
        assert self.proc is not None
        pid = self.proc.pid
        os.killpg(pid, signal.SIGSTOP)
        wait_until(lambda: Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("T"), 5, "the pause")

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


def _replace_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def fail_open_edit(gateway: str, text: str) -> str:
    """The docs' edit of the shipped file that makes the gateway fail open."""
    if gateway == "nginx":
        text = _replace_once(text, "error_page 500 = @unavailable;", "error_page 500 = @app;")
        app = "        location @app {\n            proxy_pass http://app;\n        }\n\n"
        return _replace_once(text, "        location @limited {", app + "        location @limited {")
    lines = [line for line in text.splitlines(keepends=True) if not line.startswith("    http-request return status 503")]
    assert len(lines) == text.count("\n") - 1
    if gateway in SPOE_GATEWAYS:  # the 503 line was all: refusals still apply, no answer lets it through
        return "".join(lines)
    return _replace_once("".join(lines), "/check closed", "/check open")


class Stack:
    """backend <- gateway (shipped configuration) -> ``ratewarden serve POLICY``, on free ports."""

    def __init__(
        self, gateway: str, directory: Path, backend_port: int, fail_open: bool = False, workers: int = 1
    ) -> None:
        self.gateway = gateway
        self.dir = directory
        self.ports = {"gateway": free_port(), "service": free_port(), "backend": backend_port}
        serve = [*RATEWARDEN, "serve", "policy.toml", "--http", f"{HOST}:{self.ports['service']}", "--log-format", "text",
                 "--workers", str(workers)]
        if gateway in SPOE_GATEWAYS:
            self.ports["spoe"] = free_port()
            serve += ["--spoe", f"{HOST}:{self.ports['spoe']}"]
        if gateway == "haproxy-spoe-compiled":
            require_compiled_front()
            serve += ["--spoe-front", "compiled"]
        (directory / "policy.toml").write_text(POLICY, encoding="utf-8")
        self.service = Process(serve, directory / "serve.log", directory)
        if gateway == "nginx":
            conf = write_configs(directory, "nginx.conf", **self.ports)["nginx.conf"]
            prefix = directory / "nginx"
            prefix.mkdir()
            argv = ["nginx", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"]
        elif gateway in SPOE_GATEWAYS:
            conf = write_configs(directory, "haproxy-spoe.cfg", "spoe.conf", **self.ports)["haproxy-spoe.cfg"]
            argv = ["haproxy", "-f", str(conf), "-db"]
        else:
            conf = write_configs(directory, "haproxy.cfg", "ratewarden.lua", **self.ports)["haproxy.cfg"]
            argv = ["haproxy", "-f", str(conf), "-db"]
        if fail_open:
            conf.write_text(fail_open_edit(gateway, conf.read_text()))
        self.proxy = Process(argv, directory / f"{gateway}.log", directory)

    @property
    def port(self) -> int:
        return self.ports["gateway"]

    def start_service(self) -> None:
        self.service.start()
        wait_until(
            lambda: self.service.alive() and _get(self.ports["service"], "/healthz") == 200, 20, "ratewarden serve"
        )

    def start(self) -> Stack:
        self.start_service()
        self.proxy.start()
        # An unlimited path (no rule) answered 200 through the gateway: everything is up.
        wait_until(lambda: self.proxy.alive() and _get(self.port, "/ready") == 200, 20, f"{self.gateway} up")
        return self

    def close(self) -> None:
        self.proxy.stop()
        self.service.stop()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.dir.glob("*.log"))
        )


@pytest.fixture(scope="module")
def backend_port() -> Iterator[int]:
    with backend() as port:
        yield port


@pytest.fixture(params=GATEWAYS)
def stack(request: pytest.FixtureRequest, backend_port: int) -> Iterator[Stack]:
    with running(request.param, backend_port) as built:
        yield built


@contextlib.contextmanager
def running(gateway: str, backend_port: int, fail_open: bool = False, workers: int = 1) -> Iterator[Stack]:
    """A started ``Stack`` (skips when the gateway is not installed); stopped and removed after."""
    binary = gateway.partition("-")[0]
    if shutil.which(binary) is None:
        pytest.skip(f"{binary} is not installed (scripts/install-system-deps.sh installs it)")
    for attempt in range(3):
        directory = Path(tempfile.mkdtemp(prefix=f"rw-{gateway}-"))
        directory.chmod(0o755)  # nginx's workers run as nobody under root: its temp paths must be reachable
        built = Stack(gateway, directory, backend_port, fail_open, workers)
        try:
            built.start()
            break
        except RuntimeError:
            logs = built.logs()
            built.close()
            shutil.rmtree(directory, ignore_errors=True)
            # A free port taken by someone else before our server bound it: new ports.
            if "in use" not in logs or attempt == 2:
                print(logs)
                raise
    try:
        yield built
    except BaseException:
        print(built.logs())
        raise
    finally:
        built.close()
        shutil.rmtree(directory, ignore_errors=True)


Answer = tuple[int, dict[str, str], bytes]


def request(port: int, method: str, path: str, headers: dict[str, str], timeout: float = 20.0) -> Answer:
    """One request on its own connection: status, headers (lower-case names), body."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        body = b"payload" if method == "PUT" else None
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


# --- tiers, exactly ----------------------------------------------------------------------------


def test_tiers_are_held_exactly_per_api_key(stack: Stack) -> None:
    """30 concurrent requests for each key (mixed PUT and GET, as seed 003), all at once: exactly
    each key's group limit is admitted, the rest get 429, and every answer has the headers."""
    jobs = [(key, i) for i in range(PER_KEY) for key in KEYS]

    def one(job: tuple[str, int]) -> tuple[str, Answer]:
        key, i = job
        method = "PUT" if i % 2 else "GET"
        credentials = {"Authorization": f"Bearer {key}"} if key.startswith("trial-") else {"X-API-Key": key}
        return key, request(stack.port, method, f"/api/objects/{i}", credentials)

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(one, jobs))

    for key, (group, limit) in KEYS.items():
        answers = [answer for k, answer in results if k == key]
        statuses = [status for status, _, _ in answers]
        assert set(statuses) <= {200, 429}, (key, sorted(set(statuses)), stack.logs())
        assert statuses.count(200) == min(limit, PER_KEY), (key, group, statuses.count(200))
        for status, headers, body in answers:
            assert headers.get("x-ratelimit-limit") == str(limit), (key, status, headers)
            assert f'"api.{group}";q={limit};' in headers.get("ratelimit-policy", ""), (key, status, headers)
            assert re.fullmatch(rf'"api\.{group}";r=\d+;t=\d+', headers.get("ratelimit", "")), (key, headers)
            if status == 200:
                assert body.startswith(b"backend "), body
            else:
                assert int(headers["retry-after"]) >= 1, headers
                assert headers["content-type"] == "application/problem+json", headers
                assert headers["x-ratelimit-remaining"] == "0", headers
                if stack.gateway.startswith("haproxy"):  # the service's own answer, passed on (nginx has its own body)
                    assert json.loads(body)["group"] == group, body
    # A key in the query string counts as the same key (seed 003 reads it from either place).
    status, headers, _ = request(stack.port, "GET", "/api/objects/q?api_key=bk-basic", {})
    assert (status, headers["x-ratelimit-remaining"]) == (429, "0")


def test_clients_cannot_describe_their_own_request(stack: Stack) -> None:
    """What the gateway tells the service (client address, method, URI) is the gateway's own: 20
    key-less requests, each claiming another address and an unlimited path, count as what they
    are, one client (127.0.0.1, the anonymous group's 8) on /api/objects."""

    def spoofed(i: int) -> int:
        claims = {
            "X-Real-IP": f"10.0.0.{i}", "X-Forwarded-For": f"10.0.1.{i}",
            "X-Original-URI": "/ready", "X-Original-Method": "OPTIONS",
            "X-Forwarded-Uri": "/ready", "X-Forwarded-Method": "OPTIONS",
        }
        return request(stack.port, "GET", "/api/objects", claims)[0]

    with ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(spoofed, range(20)))
    assert (statuses.count(200), statuses.count(429)) == (8, 12), statuses


# --- the service goes down ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["killed", "paused"])
def test_service_down_mid_traffic_answers_503(stack: Stack, how: str) -> None:
    """Traffic flows; the service is killed (or stopped: it accepts connections and never
    answers): every request sent after that is answered 503 with Retry-After (both gateways fail
    closed, as documented), none is let through, none is a 500 or 502; back, requests are checked
    again."""
    stop = threading.Event()
    down = threading.Event()
    seen: list[tuple[bool, int, dict[str, str]]] = []  # (sent once the service was down, status, headers)

    def traffic() -> None:
        while not stop.is_set():
            after = down.is_set()
            status, headers, _ = request(stack.port, "GET", "/api/objects", {"X-API-Key": "ik-bulk"})
            seen.append((after, status, headers))

    threads = [threading.Thread(target=traffic, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(seen) >= 12, 20, "traffic through the gateway")
        if how == "killed":
            stack.service.stop(signal.SIGKILL)
        else:
            stack.service.pause()
        down.set()
        # A stopped service costs nginx its 1 s read timeout per request: fewer answers to wait for.
        wanted = 20 if how == "killed" else 8
        wait_until(lambda: sum(after for after, _, _ in seen) >= wanted, 30, "answers once the service is down")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        if how == "paused":
            stack.service.resume()

    before = [(status, headers) for was_after, status, headers in seen if not was_after]
    after = [(status, headers) for was_after, status, headers in seen if was_after]
    assert {status for status, _ in before} <= {200, 503}, sorted({status for status, _ in before})
    for status, headers in before:
        assert status == 503 or headers["x-ratelimit-limit"] == "1000000", headers
    assert [status for status, _ in before].count(200) >= 12 - 4, before  # the first ones, at least
    assert {status for status, _ in after} == {503}, sorted({status for status, _ in after})
    for _, headers in after:
        assert headers.get("retry-after") == "1", headers
        assert headers.get("content-type") == "application/problem+json", headers

    # Back (killed: restarted with a fresh count), requests are checked and admitted again.
    if how == "killed":
        stack.start_service()
    wait_until(lambda: _get(stack.port, "/ready") == 200, 20, f"{stack.gateway} to see the service back")
    status, headers, _ = request(stack.port, "GET", "/api/objects", {"X-API-Key": "bk-basic"})
    assert (status, headers["x-ratelimit-remaining"]) == (200, "7")


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_fail_open_as_the_docs_show(gateway: str, backend_port: int) -> None:
    """The docs' edit for failing open: checked while the service answers; killed, requests reach
    the app unchecked (10 of a key whose limit is 8, without rate-limit headers)."""
    with running(gateway, backend_port, fail_open=True) as stack:
        status, headers, _ = request(stack.port, "GET", "/api/objects", {"X-API-Key": "bk-basic"})
        assert (status, headers["x-ratelimit-remaining"]) == (200, "7")
        stack.service.stop(signal.SIGKILL)
        answers = [request(stack.port, "GET", "/api/objects", {"X-API-Key": "bk-basic"}) for _ in range(10)]
    assert [status for status, _, _ in answers] == [200] * 10
    for _, headers, body in answers:
        assert body.startswith(b"backend GET"), body
        assert "x-ratelimit-remaining" not in headers, headers


@pytest.mark.parametrize("gateway", SPOE_GATEWAYS)
def test_spoe_workers_share_one_count(backend_port: int, gateway: str) -> None:
    """``--workers 3 --spoe``: three workers accept HAProxy's SPOE connections on one port, and
    whichever answers counts on one shared-memory table: 40 concurrent requests of a basic key
    admit exactly 8."""
    with running(gateway, backend_port, workers=3) as stack:
        with ThreadPoolExecutor(40) as pool:
            statuses = list(pool.map(
                lambda i: request(stack.port, "GET", f"/api/objects/{i}", {"X-API-Key": "bk-basic"})[0], range(40)))
        log = stack.dir / "serve.log"
        # On a busy machine a worker may still be starting when the others have answered everything.
        with contextlib.suppress(RuntimeError):
            wait_until(lambda: log.read_text(errors="replace").count("worker serving") >= 3, 30, "3 workers")
        text = log.read_text(errors="replace")
    assert (statuses.count(200), statuses.count(429)) == (8, 32), statuses
    assert text.count("worker serving") == 3, text


# --- the shipped files and the docs ------------------------------------------------------------


def _code_blocks(markdown: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^```[a-z]*\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL)]


@pytest.mark.parametrize(
    ("page", "files"),
    [("nginx.md", ["nginx.conf"]), ("haproxy.md", ["haproxy.cfg", "ratewarden.lua", "haproxy-spoe.cfg", "spoe.conf"]),
     ("traefik.md", ["traefik.yml"])],
)
def test_docs_show_the_shipped_files(page: str, files: list[str]) -> None:
    markdown = (DOCS / page).read_text(encoding="utf-8")
    blocks = _code_blocks(markdown)
    for name in files:
        assert config_text(name) in blocks, f"docs/gateways/{page} does not show {name} as shipped"
    if page == "nginx.md":  # the fail-open edit, as test_fail_open_as_the_docs_show makes it
        assert "error_page 500 = @app;" in markdown
        assert "        location @app {\n            proxy_pass http://app;\n        }\n" in markdown


def test_config_text_substitutes_the_documented_ports() -> None:
    assert {"haproxy.cfg", "haproxy-spoe.cfg", "nginx.conf", "ratewarden.lua", "spoe.conf", "traefik.yml"} <= set(names())
    assert "server ratewarden1 127.0.0.1:8082" in config_text("haproxy-spoe.cfg")
    assert "server ratewarden1 127.0.0.1:18082" in config_text("haproxy-spoe.cfg", spoe=18082)
    for name in ("haproxy.cfg", "nginx.conf", "traefik.yml"):
        text = config_text(name)
        for role in ("gateway", "service", "backend"):
            assert f"127.0.0.1:{DEFAULT_PORTS[role]}" in text, (name, role)
    swapped = config_text("nginx.conf", gateway=8080, service=8000, backend=19000)
    assert "listen 127.0.0.1:8080;" in swapped
    assert "server 127.0.0.1:8000;" in swapped and "server 127.0.0.1:19000;" in swapped
    assert "127.0.0.1:9000" not in swapped
    with pytest.raises(TypeError, match="unknown port role"):
        config_text("nginx.conf", admin=1)
    with pytest.raises(ArgumentError, match="no gateway configuration"):
        config_text("caddy.json")


def test_traefik_configuration_is_forward_auth_to_the_check_api() -> None:
    """Traefik is not installable here: the file is checked against Traefik's documented schema."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(config_text("traefik.yml", service=18080, backend=19000))
    http_config = config["http"]
    auth = http_config["middlewares"]["ratewarden"]["forwardAuth"]
    assert auth["address"] == "http://127.0.0.1:18080/check"
    assert {"RateLimit", "RateLimit-Policy", "X-RateLimit-Remaining"} <= set(auth["authResponseHeaders"])
    # Only the credentials pass: a client's own X-Real-IP or X-Original-URI would be believed.
    assert auth["authRequestHeaders"] == ["X-API-Key", "Authorization"]
    assert auth["trustForwardHeader"] is False
    assert http_config["routers"]["api"]["middlewares"] == ["ratewarden"]
    assert http_config["services"]["app"]["loadBalancer"]["servers"] == [{"url": "http://127.0.0.1:19000"}]
