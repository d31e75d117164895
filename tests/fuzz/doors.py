"""The running doors the fuzz tests speak to: one ``ratewarden serve`` process per front door
(``compiled``: gRPC, HTTP and SPOE all served by ``ratewarden._front``; ``python``: grpc.aio, uvicorn
and the asyncio agent), each with a policy file and an Envoy configuration, on free loopback ports.

A door runs as its own process so a crash (a Rust panic that aborts, a segfault) ends it, not the
test run; its log (stderr) is read afterwards for panics, tracebacks and error-level events, and its
resident memory (``VmRSS``) is bounded.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

from ratewarden.bench.services import free_port
from ratewarden.serve.front import build_record, compiled_module
from tests.front_door import require_compiled_front
from tests.servers import wait_until

HOST = "127.0.0.1"
FRONTS = ("compiled", "python")

#: The bound on a door's resident memory once it has been fuzzed (it starts near 60 MB).
RSS_BOUND_MB = 300

#: The SPOE timeouts the doors run with: short, so a frame left unfinished is ended soon.
SPOE_TIMEOUT_FRAME = 0.5
SPOE_TIMEOUT_IDLE = 1.0
SPOE_TIMEOUT_HELLO = 1.0

#: Seconds any answer may take on two busy cores before the fuzz tests call it a hang.
SLACK = 10.0

#: The API key the probes send: an unlimited group, so a probe is always 200.
PROBE_KEY = "pk-probe"

POLICY = """
version = 1

[identity]
sources = ["header:X-API-Key", "bearer", "query:api_key"]
unknown_group = "basic"
anonymous_group = "anonymous"

[identity.keys]
"pk-probe" = "internal"
"pk-small" = "small"

[groups.small]
limits = "3/hour"

[groups.basic]
limits = "1000000/hour"

[groups.anonymous]
limits = "1000000/hour"

[groups.internal]
unlimited = true

[[rules]]
path = "/health"
bypass = true

[[rules]]
name = "api"
path = "/api/**"
tiered = true

[[rules]]
name = "login"
path = "/login"
methods = ["POST"]
rate = "1000000/hour"
key = "ip"

[[rules]]
name = "other"
path = "/**"
rate = "1000000/hour"
key = "header:X-User"
"""

ENVOY = """
domain: fuzz
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  - key: small
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: open
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: nested
    descriptors:
      - key: inner
        rate_limit: {unit: day, requests_per_unit: 1000000}
  - key: free
    rate_limit: {unlimited: true}
"""

#: What a door's log must never hold: a Rust panic, a Python traceback, an error-level event.
_BAD_LOG = ("panicked", "Traceback", "RUST_BACKTRACE", "Segmentation", "core dumped")


def require_front(front: str) -> None:
    """Return when ``front`` can run here. The compiled front door missing fails the test, unless
    ``RATEWARDEN_EXPECT_COMPILED=0`` says this run may go without it; then the project's rule applies
    (``tests.front_door``): skip, with the reason, only where it could not have been built."""
    if front != "compiled":
        return
    module, why = compiled_module()
    if module is not None:
        return
    if os.environ.get("RATEWARDEN_EXPECT_COMPILED") == "0":
        require_compiled_front()
        return
    pytest.fail(f"the compiled front door (ratewarden._front) is missing: {why} (build record: {build_record()}); "
                "set RATEWARDEN_EXPECT_COMPILED=0 only where it cannot be built")


class Hang(AssertionError):
    """No answer and no close within ``SLACK`` seconds: the door hangs."""


class Door:
    """One ``ratewarden serve`` process serving gRPC, HTTP and SPOE on ``front``.

    Once it dies or hangs (``guard``), it is ``broken``: every later example fails at once with the
    input that broke it, so hypothesis's shrinking neither waits on a dead door nor hides the culprit;
    the ``door`` fixture starts a new process for the next test.
    """

    broken: str | None = None

    def __init__(self, directory: Path, front: str) -> None:
        self.front = front
        self.directory = directory
        policy, envoy = directory / "policy.toml", directory / "envoy.yaml"
        policy.write_text(POLICY)
        envoy.write_text(ENVOY)
        self.http_port, self.grpc_port, self.spoe_port = free_port(), free_port(), free_port()
        while len({self.http_port, self.grpc_port, self.spoe_port}) < 3:  # a port handed out twice
            self.grpc_port, self.spoe_port = free_port(), free_port()
        self.grpc_address = f"{HOST}:{self.grpc_port}"
        self.log = directory / f"serve-{front}.log"
        argv = [
            sys.executable, "-m", "ratewarden.cli", "serve", str(policy), str(envoy),
            "--http", f"{HOST}:{self.http_port}", "--grpc", self.grpc_address, "--spoe", f"{HOST}:{self.spoe_port}",
            "--front", front, "--http-front", front, "--spoe-front", front, "--watch", "0", "--workers", "1",
            "--spoe-timeout-frame", str(SPOE_TIMEOUT_FRAME), "--spoe-timeout-idle", str(SPOE_TIMEOUT_IDLE),
            "--spoe-timeout-hello", str(SPOE_TIMEOUT_HELLO), "--http-timeout", "2",
        ]
        env = {**os.environ, "RUST_BACKTRACE": "0"}
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, env=env,
                                         preexec_fn=_die_with_parent)

    def ready(self) -> Door:
        def up() -> bool:
            assert self.proc.poll() is None, f"the {self.front} door exited at start:\n{self.tail()}"
            try:
                return httpx.get(f"http://{HOST}:{self.http_port}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 30, f"the {self.front} door's /healthz")
        started = [e for e in self.events() if e.get("event") == "started"]
        assert started, self.tail()
        for door in ("front", "http_front", "spoe_front"):
            assert started[0][door] == self.front, (door, started[0])
        for port in (self.grpc_port, self.spoe_port):
            wait_until(lambda p=port: _listening(p), 10, f"port {port} of the {self.front} door")
        return self

    def events(self) -> list[dict[str, object]]:
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                out.append(event)
        return out

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def alive(self) -> None:
        """Fail (with the log's end) when the process has exited."""
        code = self.proc.poll()
        assert code is None, f"the {self.front} door died (exit {code}):\n{self.tail()}"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS line")

    @contextlib.contextmanager
    def guard(self, sent: object) -> Iterator[None]:
        """Around one example: when the door dies or hangs on ``sent``, it is ``broken`` (see above)."""
        if self.broken is not None:
            raise AssertionError(self.broken)
        try:
            yield
        except Exception as exc:
            if self.proc.poll() is None and not isinstance(exc, Hang):
                raise  # a wrong answer: hypothesis shrinks it
            self._break(sent, exc)
        if self.proc.poll() is not None:
            self._break(sent, None)

    def _break(self, sent: object, exc: Exception | None) -> NoReturn:
        code = self.proc.poll()
        what = f"died (exit {code})" if code is not None else "hung"
        shown = repr(sent)
        shown = shown if len(shown) < 2000 else f"{shown[:2000]}... ({len(shown)} characters)"
        self.broken = f"the {self.front} door {what} on {shown}: {exc or ''}\n{self.tail()}"
        raise AssertionError(self.broken) from exc

    def mark(self) -> int:
        """Where the log ends now: ``problems(since=...)`` reads only what comes after."""
        return self.log.stat().st_size

    def problems(self, since: int = 0) -> list[str]:
        """The log lines (after byte ``since``) that say something went wrong: panics, tracebacks,
        error-level events."""
        bad = []
        with open(self.log, "rb") as log:
            log.seek(since)
            text = log.read().decode(errors="replace")
        for line in text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if isinstance(event, dict):
                if event.get("level") in ("error", "critical"):
                    bad.append(line)
            elif any(word in line for word in _BAD_LOG):
                bad.append(line)
        return bad

    def healthy(self, since: int = 0) -> None:
        """Alive, under the memory bound, and nothing wrong logged (after byte ``since``)."""
        self.alive()
        rss = self.rss_mb()
        assert rss < RSS_BOUND_MB, f"the {self.front} door holds {rss:.0f} MB (bound {RSS_BOUND_MB} MB)"
        problems = self.problems(since)
        assert not problems, f"the {self.front} door logged:\n" + "\n".join(problems[:20])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        (Path("/dev/shm") / f"ratewarden-serve-{self.proc.pid}.shm").unlink(missing_ok=True)


def _die_with_parent() -> None:
    """In the child before ``exec``: SIGKILL when the test run ends without stopping it (killed)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def _listening(port: int) -> bool:
    with socket.create_connection((HOST, port), timeout=2):
        return True


def start_door(directory: Path, front: str) -> Door:
    door = Door(directory, front)
    try:
        return door.ready()
    except BaseException:
        door.stop()
        raise
