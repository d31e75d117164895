"""``ratewarden serve --envoy-env`` (serve/envoy_env.py) as a Deployment of envoyproxy/ratelimit runs it:
real ``ratewarden serve`` processes started with the reference's environment and a runtime directory
(``RUNTIME_ROOT`` a symlink swapped to a new version), on a real redis-server; gRPC calls with the
generated Envoy client, ``/healthcheck``, ``/json``, the Prometheus series at ``PROMETHEUS_ADDR`` +
``PROMETHEUS_PATH`` with the values the reference's rules give, the reload on the swap, the start-up
messages of unsupported settings and the exit status 2 of bad ones. Where the reference binary is built
(``go install github.com/envoyproxy/ratelimit/src/service_cmd@latest``, as the gateway bench builds it),
the same calls go to it too, and its Prometheus counters are compared with ratewarden's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.bench.services import free_port
from tests.servers import wait_until

grpc = pytest.importorskip("grpc")
rls_pb2 = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
rls_pb2_grpc = pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2_grpc")
pytest.importorskip("prometheus_client")

from .test_grpc import OK, OVER, desc  # noqa: E402

CONFIG = """
domain: {domain}
descriptors:
  - key: foo
    rate_limit: {{unit: hour, requests_per_unit: 5}}
  - key: remote_address
    detailed_metric: true
    rate_limit: {{unit: hour, requests_per_unit: 2}}
  - key: shady
    shadow_mode: true
    rate_limit: {{unit: hour, requests_per_unit: 1}}
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {{unit: hour, requests_per_unit: 1}}
"""
HOUR = rls_pb2.RateLimitResponse.RateLimit.Unit.HOUR


def calls(domain: str) -> list[tuple[Any, int]]:
    """The calls both services get, and the overall code each answers."""
    one = rls_pb2.RateLimitRequest
    out: list[tuple[Any, int]] = []
    out += [(one(domain=domain, descriptors=[desc(("foo", "x"))]), OK if i < 5 else OVER) for i in range(7)]
    out += [(one(domain=domain, descriptors=[desc(("remote_address", "10.0.0.1"))]), OK if i < 2 else OVER)
            for i in range(3)]
    out += [(one(domain=domain, descriptors=[desc(("shady", "a"))]), OK) for _ in range(2)]
    out += [(one(domain=domain, hits_addend=3, descriptors=[desc(("foo", "y"))]), OK),
            (one(domain=domain, hits_addend=3, descriptors=[desc(("foo", "y"))]), OVER),
            (one(domain=domain, descriptors=[desc(("foo", "y"))]), OVER)]
    pair = desc(("source_cluster", "proxy"), ("destination_cluster", "mock"))
    out += [(one(domain=domain, descriptors=[pair]), OK if i == 0 else OVER) for i in range(3)]
    out += [(one(domain=domain, descriptors=[desc(("foo", "z"), limit=(1, HOUR))]), OK if i == 0 else OVER)
            for i in range(2)]
    return out


def expected(domain: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
    """What the reference's rules (its base_limiter.go, NEAR_LIMIT_RATIO 0.8) count for ``calls``."""
    def key(stat: str, *labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return f"ratelimit_service_rate_limit_{stat}", tuple(zip(("domain", "key1", "key2")[: len(labels) + 1], (domain, *labels), strict=True))

    return {
        # foo=x: 7 calls on 5 (near from the 5th: floor(5 * 0.8) = 4); foo=y: 3 within, then 3 of which
        # 1 over and 1 near, then 1 over
        key("total_hits", "foo"): 14, key("within_limit", "foo"): 8, key("near_limit", "foo"): 2,
        key("over_limit", "foo"): 4,
        # detailed_metric: the request's value, its IPv4 dots sanitized
        key("total_hits", "remote_address_10_0_0_1"): 3, key("within_limit", "remote_address_10_0_0_1"): 2,
        key("near_limit", "remote_address_10_0_0_1"): 1, key("over_limit", "remote_address_10_0_0_1"): 1,
        key("total_hits", "shady"): 2, key("within_limit", "shady"): 1, key("near_limit", "shady"): 1,
        key("over_limit", "shady"): 1, key("shadow_mode", "shady"): 1,
        key("total_hits", "source_cluster_proxy", "destination_cluster_mock"): 3,
        key("within_limit", "source_cluster_proxy", "destination_cluster_mock"): 1,
        key("near_limit", "source_cluster_proxy", "destination_cluster_mock"): 1,
        key("over_limit", "source_cluster_proxy", "destination_cluster_mock"): 2,
        # a limit override: domain.key_value of the request
        key("total_hits", "foo_z"): 2, key("within_limit", "foo_z"): 1, key("near_limit", "foo_z"): 1,
        key("over_limit", "foo_z"): 1,
    }


_SAMPLE = re.compile(r'^(ratelimit_service_[a-z_]+)(?:\{(.*)\})? (\S+)$')


def series(text: str, domain: str | None = None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The ``ratelimit_service_*`` samples of a Prometheus text page (of ``domain``'s, when given)."""
    out = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found is None:
            continue
        labels = tuple(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', found.group(2) or ""))
        if domain is not None and ("domain", domain) not in labels:
            continue
        out[(found.group(1), labels)] = float(found.group(3))
    return out


def swap(data: Path, version: str, files: dict[str, str], appdir: str = "config") -> Path:
    """Write ``<data>/<version>/ratelimit/<appdir>/`` and point ``<data>/current`` at it in one rename
    (the reference's runtime swap); ``current``."""
    directory = data / version / "ratelimit" / appdir
    directory.mkdir(parents=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    link = data / f"current.{version}"
    link.symlink_to(version)
    os.replace(link, data / "current")
    return data / "current"


class EnvServe:
    """``ratewarden serve --envoy-env`` with the reference's environment (JSON log lines in a file)."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *args: str, binary: list[str] | None = None) -> None:
        self.http, self.grpc, self.prometheus = free_port(), free_port(), free_port()
        self.log = tmp_path / f"serve-{self.http}.log"
        self.env = {
            "HOST": "127.0.0.1", "PORT": str(self.http), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(self.grpc),
            "DEBUG_PORT": str(free_port()), "PROMETHEUS_ADDR": f"127.0.0.1:{self.prometheus}",
            "LOG_FORMAT": "json", "LOG_LEVEL": "info", "USE_STATSD": "false", **env,
        }
        argv = binary or [sys.executable, "-m", "ratewarden.cli", "serve", "--envoy-env", *args]
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(argv, env={**os.environ, **self.env}, stdout=err, stderr=err,
                                         start_new_session=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.http}{path}"

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == name:
                found.append(event)
        return found

    def up(self, status: int = 200) -> EnvServe:
        def ready() -> bool:
            assert self.proc.poll() is None, f"serve exited early:\n{self.log.read_text()}"
            try:
                return httpx.get(self.url("/healthcheck"), timeout=2).status_code == status
            except httpx.HTTPError:
                return False

        wait_until(ready, 30, "/healthcheck")
        return self

    def call(self, request: Any) -> Any:
        with grpc.insecure_channel(f"127.0.0.1:{self.grpc}") as channel:
            return rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=10)

    def scrape(self) -> str:
        answer = httpx.get(f"http://127.0.0.1:{self.prometheus}/metrics", timeout=5)
        assert answer.status_code == 200
        return answer.text

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise AssertionError(f"serve did not stop:\n{self.log.read_text()}") from None


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Any]:
    servers: list[EnvServe] = []

    def start(env: dict[str, str], *args: str, binary: list[str] | None = None) -> EnvServe:
        servers.append(EnvServe(tmp_path, env, *args, binary=binary))
        return servers[-1]

    yield start
    for server in servers:
        if server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)


def redis_env(redis: Any, runtime: Path) -> dict[str, str]:
    """The reference's environment for one Redis on TCP and a runtime directory, Prometheus on."""
    return {
        "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": f"127.0.0.1:{redis.port}", "RUNTIME_ROOT": str(runtime),
        "RUNTIME_SUBDIRECTORY": "ratelimit", "USE_PROMETHEUS": "true",
    }


def test_a_reference_deployment_runs_as_it_is(tmp_path: Path, redis_standalone: Any, started: Any) -> None:
    """gRPC, /json and /healthcheck on the reference's ports, its Prometheus series with the values
    its rules give, the reload on the swap of RUNTIME_ROOT, and a clean stop."""
    domain = f"rl{uuid.uuid4().hex[:8]}"
    data = tmp_path / "runtime_data"
    current = swap(data, "v1", {"config.yaml": CONFIG.format(domain=domain)})
    server = started(redis_env(redis_standalone, current)).up()
    health = httpx.get(server.url("/healthcheck"), timeout=5)
    assert (health.status_code, health.text) == (200, "OK")
    for request, code in calls(domain):
        assert server.call(request).overall_code == code, request
    refused = httpx.post(server.url("/json"), json={"domain": domain, "descriptors": [{"entries": [
        {"key": "foo", "value": "x"}]}]}, timeout=5)
    assert refused.status_code == 429 and refused.json()["overallCode"] == "OVER_LIMIT"
    assert not refused.json().get("responseHeadersToAdd")  # LIMIT_RESPONSE_HEADERS_ENABLED is off by default
    want = expected(domain)
    want[("ratelimit_service_rate_limit_total_hits", (("domain", domain), ("key1", "foo")))] += 1  # /json counts
    want[("ratelimit_service_rate_limit_over_limit", (("domain", domain), ("key1", "foo")))] += 1
    page = server.scrape()
    assert series(page, domain) == want
    timed = series(page)
    assert timed[("ratelimit_service_total_requests", (("grpc_method", "ShouldRateLimit"),))] == len(calls(domain))
    assert timed[("ratelimit_service_response_time_seconds_count", (("grpc_method", "ShouldRateLimit"),))] == len(
        calls(domain))  # gRPC only, as the reference's interceptor
    assert httpx.get(f"http://127.0.0.1:{server.prometheus}/other", timeout=5).status_code == 404

    swap(data, "v2", {"config.yaml": CONFIG.format(domain=domain).replace("requests_per_unit: 5", "requests_per_unit: 50")})
    wait_until(lambda: server.events("reloaded"), 20, "the reload on the swap")
    assert server.call(rls_pb2.RateLimitRequest(domain=domain, descriptors=[desc(("foo", "x"))])).overall_code == OK
    assert server.stop() == 0


def test_the_references_default_socket_type_unix(tmp_path: Path, redis_standalone: Any, started: Any) -> None:
    """REDIS_SOCKET_TYPE=unix (the reference's default) with REDIS_URL the socket's path: the same
    answers as over TCP, counted in the same Redis."""
    domain = f"rl{uuid.uuid4().hex[:8]}"
    current = swap(tmp_path / "runtime_data", "v1", {"config.yaml": CONFIG.format(domain=domain)})
    env = {**redis_env(redis_standalone, current), "REDIS_SOCKET_TYPE": "unix", "REDIS_URL": redis_standalone.socket}
    server = started(env).up()
    assert server.events("started")[0]["store"].startswith(f"unix://{redis_standalone.socket}")
    for request, code in calls(domain):
        assert server.call(request).overall_code == code, request
    assert server.stop() == 0


def test_the_references_default_path_through_twemproxy(tmp_path: Path, twemproxy: Any, started: Any) -> None:
    """REDIS_URL a socket under a ``nutcracker`` directory, as the reference's default: the store goes
    through twemproxy (``twemproxy=1``: no command it refuses), the same answers."""
    domain = f"rl{uuid.uuid4().hex[:8]}"
    current = swap(tmp_path / "runtime_data", "v1", {"config.yaml": CONFIG.format(domain=domain)})
    env = {"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": twemproxy.socket, "RUNTIME_ROOT": str(current),
           "RUNTIME_SUBDIRECTORY": "ratelimit"}
    server = started(env).up()
    assert server.events("started")[0]["store"].endswith("twemproxy=1")
    for request, code in calls(domain):
        assert server.call(request).overall_code == code, request
    assert server.stop() == 0


def test_bad_and_unsupported_settings_are_named_at_start_up(tmp_path: Path, started: Any) -> None:
    """A value the reference would refuse, and a setting that would change what is enforced: exit status
    2 and one line naming the variable, no traceback. One that changes only what is observed: one
    warning line each, and the service runs."""
    current = swap(tmp_path / "runtime_data", "v1", {"config.yaml": CONFIG.format(domain="rl")})
    base = {"RUNTIME_ROOT": str(current), "RUNTIME_SUBDIRECTORY": "ratelimit", "REDIS_SOCKET_TYPE": "tcp",
            "REDIS_URL": "127.0.0.1:1"}
    for env, named in (
        ({"CONFIG_TYPE": "GRPC_XDS_SOTW"}, "CONFIG_TYPE=GRPC_XDS_SOTW is not supported"),
        ({"PORT": "80a"}, "PORT='80a': must be a whole number"),
        ({"USE_PROMETHEUS": "yes"}, "USE_PROMETHEUS='yes': must be true or false"),
        ({"REDIS_TIMEOUT": "10"}, "REDIS_TIMEOUT='10': must be a Go duration"),
        ({"REDIS_SOCKET_TYPE": "unix"}, "with REDIS_SOCKET_TYPE=unix: must be the socket's absolute path"),
        ({"REDIS_TYPE": "SENTINEL"}, "expected master name and sentinels"),
        ({"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": "a:1,b:2"}, "one server"),
        ({"GRPC_UDS": "/tmp/rl.sock"}, "GRPC_UDS=/tmp/rl.sock is not supported"),
        ({"LOG_LEVEL": "loud"}, "LOG_LEVEL='loud'"),
        ({"RUNTIME_ROOT": "/no/such/dir/current"}, "RUNTIME_ROOT=/no/such/dir/current"),
    ):
        server = started({**base, **env})
        assert server.proc.wait(60) == 2, server.log.read_text()
        text = server.log.read_text()
        assert named in text and "--envoy-env" in text and "Traceback" not in text, text
        assert len(text.strip().splitlines()) == 1, text
    notes = started({**base, "DEBUG_PORT": "6070", "TRACING_ENABLED": "true", "USE_STATSD": "true",
                     "REDIS_PERSECOND": "true"}, "--store", "memory://").up()
    named = {event["setting"]: event["message"] for event in notes.events("envoy_env_unsupported")}
    assert set(named) == {"DEBUG_PORT", "TRACING_ENABLED", "USE_STATSD", "REDIS_PERSECOND"}, named
    assert "no debug listener" in named["DEBUG_PORT"] and "no statsd" in named["USE_STATSD"]
    assert notes.stop() == 0


def test_configmap_layout_health_and_ratewarden_options(tmp_path: Path, started: Any) -> None:
    """A Kubernetes ConfigMap's layout (RUNTIME_WATCH_ROOT=false, RUNTIME_IGNOREDOTFILES=true: its ``..data``
    entries skipped), HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED (500 until a file with a domain arrives),
    global SHADOW_MODE, the reference's headers under other names; with ratewarden's own options given
    too (they win over the environment): --store, --workers 2 (the series summed over both), /metrics."""
    config = tmp_path / "data" / "ratelimit" / "config"
    config.mkdir(parents=True)
    (config / "..2026_01_01").mkdir()
    (config / "..2026_01_01" / "config.yaml").write_text("not: a valid config")
    env = {
        "RUNTIME_ROOT": str(tmp_path / "data"), "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false",
        "RUNTIME_IGNOREDOTFILES": "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true", "SHADOW_MODE": "true",
        "LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_REMAINING_HEADER": "X-Left", "USE_PROMETHEUS": "true",
        "REDIS_SOCKET_TYPE": "unix",  # not read: --store is given
    }
    server = started(env, "--store", f"shm://envoy-env-{uuid.uuid4().hex[:8]}", "--workers", "2", "--watch", "0.2")
    server.up(status=500)  # no configuration yet
    wait_until(lambda: len(server.events("worker_started")) >= 2, 20, "both workers")
    (config / "rl.yaml").write_text("domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
    server.up(status=200)
    # Each worker watches on its own: health answered by one does not mean the other has the file yet.
    wait_until(lambda: sum("rl.yaml" in str(e.get("path")) for e in server.events("reloaded")) >= 2, 20,
               "both workers' reload of rl.yaml")
    request = rls_pb2.RateLimitRequest(domain="rl", descriptors=[desc(("k", "v"))])
    answers = [server.call(request) for _ in range(3)]
    assert [a.overall_code for a in answers] == [OK, OK, OK]  # SHADOW_MODE: over, yet OK overall
    assert answers[2].statuses[0].code == OVER
    assert [h.key for h in answers[2].response_headers_to_add] == ["RateLimit-Limit", "X-Left", "RateLimit-Reset"]
    counted = series(server.scrape(), "rl")
    assert counted[("ratelimit_service_rate_limit_total_hits", (("domain", "rl"), ("key1", "k")))] == 3
    assert counted[("ratelimit_service_rate_limit_over_limit", (("domain", "rl"), ("key1", "k")))] == 1
    assert httpx.get(server.url("/metrics"), timeout=5).status_code == 200  # ratewarden's own, still there
    assert server.stop() == 0


def _reference_binary() -> str:
    from ratewarden.bench.gateway_peers import REFERENCE_MODULE, _go_tool

    found, why = _go_tool("service_cmd", REFERENCE_MODULE, False, lambda _: None)
    if not found:
        pytest.skip(f"envoyproxy/ratelimit is not built here ({why}); the values are checked against its rules above")
    return found


def test_the_counters_equal_the_references_for_the_same_calls(
    tmp_path: Path, redis_standalone: Any, started: Any
) -> None:
    """The same calls to envoyproxy/ratelimit (its binary, the same environment, the same Redis) and to
    ratewarden: every ``ratelimit_service_rate_limit_*`` series the same, and the same overall codes."""
    binary = _reference_binary()
    domain = f"rl{uuid.uuid4().hex[:8]}"
    current = swap(tmp_path / "runtime_data", "v1", {"config.yaml": CONFIG.format(domain=domain)})
    env = {**redis_env(redis_standalone, current), "STATS_FLUSH_INTERVAL": "100ms", "LOG_FORMAT": "text"}
    reference = started(env, binary=[binary]).up()
    ours = started({**env, "LOG_FORMAT": "json"}).up()
    for request, code in calls(domain):
        assert (reference.call(request).overall_code, ours.call(request).overall_code) == (code, code), request
    wait_until(lambda: len(series(reference.scrape(), domain)) == len(expected(domain)), 20, "the reference's flush")
    assert series(ours.scrape(), domain) == series(reference.scrape(), domain) == expected(domain)
    assert ours.stop() == 0
    reference.proc.send_signal(signal.SIGTERM)
    reference.proc.wait(30)


def test_the_docs_session_runs_as_written(tmp_path: Path, redis_standalone: Any, started: Any) -> None:
    """docs/gateways/envoy.md's "The image swap" session, with its environment as written (the Redis, the
    runtime directory and the ports made this test's own), answers what the page shows."""
    from .reference_fixtures import EXAMPLE_YAML

    page = (Path(__file__).resolve().parents[2] / "docs" / "gateways" / "envoy.md").read_text()
    section = page[page.index("### The image swap"):page.index("### What carries over")]
    session, shown = re.findall(r"^```(?:bash)?\n(.*?)^```", section, re.S | re.M)[-2:]
    command = session[session.index("REDIS_SOCKET_TYPE"):session.index("ratewarden serve --envoy-env")]
    env = dict(re.findall(r"([A-Z_]+)=(\S+)", command))
    assert env["RUNTIME_ROOT"] == "$PWD/runtime" and env["REDIS_URL"] == "127.0.0.1:6379"
    (tmp_path / "runtime" / "ratelimit" / "config").mkdir(parents=True)
    (tmp_path / "runtime" / "ratelimit" / "config" / "example.yaml").write_text(EXAMPLE_YAML)
    env.update(RUNTIME_ROOT=str(tmp_path / "runtime"), REDIS_URL=f"127.0.0.1:{redis_standalone.port}",
               CACHE_KEY_PREFIX=f"docs{uuid.uuid4().hex[:8]}")  # counts of this run only
    server = started(env).up()
    body = re.search(r"-d '(.*?)'", session).group(1)  # type: ignore[union-attr]
    health = httpx.get(server.url("/healthcheck"), timeout=5).text
    answer = httpx.post(server.url("/json"), content=body, timeout=5).text
    hits = [line for line in server.scrape().splitlines() if "total_hits" in line and not line.startswith("#")]
    lines = [health, re.sub(r'"\d+s"', '"44s"', answer), *hits]
    assert lines == shown.strip().splitlines()
    assert server.stop() == 0
