"""``ratewarden rls`` (src/ratewarden/cli/rls.py), run as a subprocess against a real ``ratewarden serve``
with an Envoy configuration and ``--grpc``: OK then OVER_LIMIT (exit statuses 0 then 1), ``--json`` as
``POST /json`` answers, several descriptors, ``--hits`` and ``--limit``, exit status 2 with a message for a
wrong address, a refused call and a bad command line, the extra named when grpcio is missing; and
docs/gateways/envoy.md's "Try it without Envoy" session, run as written against envoyproxy/ratelimit's
``example.yaml``, answers what the page shows."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ratewarden.bench.services import free_port

from .reference_fixtures import EXAMPLE_YAML
from .test_serve_cli import Serve, _write

pytest.importorskip("grpc")
pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2_grpc")

CONFIG = """
domain: cli_rls
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 5}
"""
DOC = Path(__file__).resolve().parents[2] / "docs" / "gateways" / "envoy.md"


def start(tmp_path: Path, config: str) -> tuple[Serve, str]:
    path = tmp_path / "envoy.yaml"
    _write(path, config)
    address = f"127.0.0.1:{free_port()}"
    return Serve(tmp_path, str(path), "--grpc", address, "--watch", "0").ready(), address


def stop(server: Serve) -> None:
    if server.proc.poll() is None:
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
    (Path("/dev/shm") / f"ratewarden-serve-{server.proc.pid}.shm").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, str]]:
    """One service for the module; each test counts under its own user."""
    server, address = start(tmp_path_factory.mktemp("rls"), CONFIG)
    yield server, address
    stop(server)


def rls(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "ratewarden.cli", "rls", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_ok_then_over_limit_exit_0_then_1(service: tuple[Serve, str]) -> None:
    _, address = service
    user = f"user={uuid.uuid4().hex}"
    answers = [rls("--domain", "cli_rls", "--descriptor", user, "--address", address) for _ in range(3)]
    assert [a.returncode for a in answers] == [0, 0, 1], [a.stderr for a in answers]
    first = answers[0].stdout.splitlines()
    assert first[0] == "OK"
    assert re.fullmatch(rf"  {user}: OK, limit 2/day, 1 remaining, reset in \d+s", first[1])
    assert first[2] == "headers:" and "  x-ratelimit-limit: 2" in first
    over = answers[2].stdout.splitlines()
    assert over[0] == "OVER_LIMIT" and over[1].startswith(f"  {user}: OVER_LIMIT, limit 2/day, 0 remaining")
    assert any(line.startswith("  retry-after: ") for line in over)
    assert answers[2].stderr == ""


def test_json_is_what_post_json_answers(service: tuple[Serve, str]) -> None:
    server, address = service
    user = uuid.uuid4().hex
    answer = rls("--domain", "cli_rls", "--descriptor", f"user={user}", "--address", address, "--json")
    assert answer.returncode == 0, answer.stderr
    printed = json.loads(answer.stdout)
    assert printed["overallCode"] == "OK" and printed["statuses"][0]["limitRemaining"] == 1
    assert printed["statuses"][0]["currentLimit"] == {"requestsPerUnit": 2, "unit": "DAY"}
    body = {"domain": "cli_rls", "descriptors": [{"entries": [{"key": "user", "value": user}]}]}
    posted = httpx.post(f"{server.url}/json", json=body, timeout=10).json()
    assert "limitRemaining" not in posted["statuses"][0]  # 0: the same counter, charged again
    for answered in (printed, posted):  # the same shape; only the counts and the reset differ
        answered["statuses"][0].pop("limitRemaining", None)
        answered["statuses"][0].pop("durationUntilReset")
        answered.pop("responseHeadersToAdd")
    assert printed == posted


def test_several_descriptors_hits_and_a_limit_override(service: tuple[Serve, str]) -> None:
    _, address = service
    user = uuid.uuid4().hex
    answer = rls("--domain", "cli_rls", "--descriptor", f"plan=free,user={user}", "--descriptor", f"user={user}",
                 "--hits", "2", "--address", address)
    assert answer.returncode == 0, answer.stderr
    lines = answer.stdout.splitlines()
    assert re.fullmatch(rf"  plan=free,user={user}: OK, limit 5/day, 3 remaining, reset in \d+s", lines[1])
    assert re.fullmatch(rf"  user={user}: OK, limit 2/day, 0 remaining, reset in \d+s", lines[2])
    answer = rls("--domain", "cli_rls", "--descriptor", f"user={user}", "--limit", "10/hour", "--address", address)
    assert answer.returncode == 0, answer.stderr
    assert re.fullmatch(rf"  user={user}: OK, limit 10/hour, 9 remaining, reset in \d+s", answer.stdout.splitlines()[1])


def test_a_domain_the_service_does_not_have_is_ok_and_said(service: tuple[Serve, str]) -> None:
    _, address = service
    answer = rls("--domain", "cli-rls", "--descriptor", "user=u", "--address", address)
    assert answer.returncode == 0 and answer.stdout.splitlines() == ["OK", "  user=u: OK, no limit"]
    assert "no limit applies to this call" in answer.stderr and "'cli-rls'" in answer.stderr


def test_a_wrong_address_exits_2_with_the_grpc_status_and_a_hint() -> None:
    address = f"127.0.0.1:{closed_port()}"
    answer = rls("--domain", "cli_rls", "--descriptor", "user=u", "--address", address, "--timeout", "5")
    assert answer.returncode == 2 and answer.stdout == ""
    assert answer.stderr.startswith(f"ratewarden rls: {address}: UNAVAILABLE: ")
    assert "is `ratewarden serve` running" in answer.stderr and "Traceback" not in answer.stderr


def test_a_refused_call_exits_2_with_the_services_message(service: tuple[Serve, str]) -> None:
    _, address = service
    answer = rls("--domain", "", "--descriptor", "user=u", "--address", address)
    assert answer.returncode == 2 and answer.stdout == ""
    assert "INVALID_ARGUMENT" in answer.stderr and "domain must not be empty" in answer.stderr


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--descriptor", "foo"], "argument --descriptor: 'foo': expected KEY=VALUE"),
        (["--descriptor", "=bar"], "argument --descriptor: '=bar'"),
        (["--descriptor", "foo=bar,"], "argument --descriptor: 'foo=bar,'"),
        (["--descriptor", "foo=bar,baz"], "argument --descriptor: 'foo=bar,baz'"),
        (["--descriptor", "foo=bar", "--limit", "10/fortnight"], "argument --limit: '10/fortnight'"),
        (["--limit", "10/minute", "--descriptor", "foo=bar"], "argument --limit: must follow the --descriptor"),
        ([], "the following arguments are required: --descriptor"),
        (["--descriptor", "foo=bar", "--hits", "-1"], "--hits must be 0 to 4294967295"),
    ],
)
def test_a_bad_command_line_exits_2_naming_it(args: list[str], named: str) -> None:
    answer = rls("--domain", "rl", *args, "--address", f"127.0.0.1:{closed_port()}")
    assert answer.returncode == 2 and answer.stdout == ""
    assert named in answer.stderr and "UNAVAILABLE" not in answer.stderr


def test_help_states_the_exit_statuses() -> None:
    text = " ".join(rls("--help").stdout.split())
    assert "0 when the answer is OK, 1 when it is OVER_LIMIT, 2 on a usage error or when the call fails" in text


def test_without_grpcio_the_extra_is_named() -> None:
    code = "import sys; sys.modules['grpc'] = None\nfrom ratewarden.cli import main\nraise SystemExit(main())"
    argv = [sys.executable, "-c", code, "rls", "--domain", "rl", "--descriptor", "foo=bar"]
    answer = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert answer.returncode == 2 and "pip install 'ratewarden[serve]'" in answer.stderr


# Numbers that depend on when the page's session ran (the seconds to the window's end).
_WHEN = re.compile(r'(reset in |t=|x-ratelimit-reset: |retry-after: |"durationUntilReset": "|"value": ")\d+')


def _normal(text: str) -> str:
    text = _WHEN.sub(r"\1N", text)
    return re.sub(r'(UNAVAILABLE: )".*"', r'\1"..."', text)


def _session() -> list[tuple[str, str]]:
    """The ``$ command`` lines of the page's "Try it without Envoy" and what each prints."""
    page = DOC.read_text(encoding="utf-8")
    section = page[page.index("## Try it without Envoy"):page.index("## The Envoy configuration")]
    found: list[tuple[str, str]] = []
    for block in re.findall(r"^```\n(.*?)^```", section, re.S | re.M):
        for command in re.split(r"^\$ ", block, flags=re.M)[1:]:
            line, _, printed = command.partition("\n")
            found.append((line, printed))
    return found


def test_docs_try_it_without_envoy_answers_as_the_page_shows(tmp_path: Path) -> None:
    page = DOC.read_text(encoding="utf-8")
    assert ("raw.githubusercontent.com/envoyproxy/ratelimit/f2fb15770f7fd1c88ca6c3a1b58ee513917ace96/"
            "examples/ratelimit/config/example.yaml") in page  # the commit reference_fixtures copies
    assert "\nratewarden serve example.yaml --grpc 127.0.0.1:8081\n" in page
    session = _session()
    assert len(session) == 7
    server, address = start(tmp_path, EXAMPLE_YAML)
    try:
        if time.time() % 60 > 40:  # the 1-a-minute pair in one window: start in a fresh minute
            time.sleep(61 - time.time() % 60)
        for line, printed in session:
            argv = shlex.split(line)
            if argv[0] == "curl":
                body = argv[argv.index("-d") + 1]
                assert argv[argv.index("-XPOST") + 1] == "127.0.0.1:8080/json"
                out = httpx.post(f"{server.url}/json", content=body, timeout=10).text + "\n"
                status = 0
            else:
                assert argv[:2] == ["ratewarden", "rls"]
                if "--address" in argv:  # the page's failing call: a port nothing listens on
                    argv[argv.index("--address") + 1] = f"127.0.0.1:{closed_port()}"
                    printed = printed.replace("127.0.0.1:9", argv[argv.index("--address") + 1])
                else:
                    argv += ["--address", address]
                answer = rls(*argv[2:])
                out, status = answer.stdout + answer.stderr, answer.returncode
            assert _normal(out) == _normal(printed), line
            expected = 2 if "UNAVAILABLE" in printed else 1 if printed.startswith("OVER_LIMIT") else 0
            assert status == expected, line
    finally:
        stop(server)
