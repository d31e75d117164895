"""``ratewarden serve``'s start-up errors as a user meets them (issue 39): a listener that cannot be
opened (its port taken by another program) and an option that cannot take effect each stop the
start-up with one line naming the option, the address, why and the fix, exit status 2, no traceback,
and no ``started`` line, for every listener (HTTP, gRPC on both front doors, SPOE), with one worker
and with several; and a worker that still cannot listen (the port taken after the supervisor's
check) stops the service with status 2 instead of a traceback or a restart loop."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratewarden.bench.services import free_port
from tests.front_door import require_compiled_front

from .test_serve_cli import ENVOY, POLICY

HOST = "127.0.0.1"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    policy, envoy = tmp_path / "policy.toml", tmp_path / "envoy.yaml"
    policy.write_text(POLICY.replace("{basic}", "5/hour"))
    envoy.write_text(ENVOY)
    return {"policy": str(policy), "envoy": str(envoy)}


@pytest.fixture
def taken() -> Iterator[str]:
    """An address another program listens on: a plain listening socket (no ``SO_REUSEADDR``, no
    ``SO_REUSEPORT``), as any other server holds its port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen(8)
        yield f"{HOST}:{sock.getsockname()[1]}"


def _serve(*args: str, bypass_check: bool = False) -> subprocess.CompletedProcess[str]:
    """``ratewarden serve ARGS`` to its end (a start-up error ends it at once); ``bypass_check``: without
    the supervisor's listen check, so a worker meets the taken port itself (as when another program
    takes it between the check and the worker's bind)."""
    patch = "import ratewarden.serve.process as p; p.check_listen = lambda *a, **k: None; " if bypass_check else ""
    code = f"import sys; {patch}from ratewarden.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "serve", *args, "--watch", "0"]
    if "--http" not in args:
        argv += ["--http", f"{HOST}:{free_port()}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _events(stderr: str) -> list[str]:
    names = []
    for line in stderr.splitlines():
        try:
            names.append(json.loads(line).get("event", ""))
        except ValueError:
            continue
    return names


def _refused(result: subprocess.CompletedProcess[str], *named: str, started: bool = False) -> str:
    """Exit status 2, ``named`` in stderr, no traceback, no ``started`` line (unless ``started``); the stderr."""
    err = result.stderr
    assert result.returncode == 2, f"exit {result.returncode}:\n{err}"
    for text in named:
        assert text in err, f"{text!r} not in:\n{err}"
    assert "Traceback" not in err, err
    if not started:
        assert "started" not in _events(err), err
    assert "worker_started" not in _events(err), err
    return err


def _in_use(err: str, option: str, address: str) -> None:
    """The one line for a taken port: the option and address, why, and the fix."""
    lines = [line for line in err.splitlines() if f"{option} {address}" in line]
    assert lines, err
    line = lines[0]
    assert "in use" in line and f"choose another port with {option}, or stop what listens there" in line, line


@pytest.mark.parametrize("workers", ["1", "2"])
def test_http_port_in_use(files: dict[str, str], taken: str, workers: str) -> None:
    err = _refused(_serve(files["policy"], "--http", taken, "--workers", workers), f"--http {taken}")
    _in_use(err, "--http", taken)


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("front", ["compiled", "python"])
def test_grpc_port_in_use(files: dict[str, str], taken: str, front: str, workers: str) -> None:
    """The issue's first case: it logged ``started``, then a traceback, and exited 1."""
    if front == "compiled":
        require_compiled_front()
    result = _serve(files["envoy"], "--grpc", taken, "--front", front, "--workers", workers)
    _in_use(_refused(result, f"--grpc {taken}"), "--grpc", taken)


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("front", ["compiled", "python"])
def test_spoe_port_in_use(files: dict[str, str], taken: str, front: str, workers: str) -> None:
    if front == "compiled":
        require_compiled_front()
    result = _serve(files["policy"], "--spoe", taken, "--spoe-front", front, "--workers", workers)
    _in_use(_refused(result, f"--spoe {taken}"), "--spoe", taken)


def test_two_listeners_on_one_address(files: dict[str, str]) -> None:
    """Two options naming one port (``0.0.0.0`` is every address, 127.0.0.1 too): said as such, not as
    "stop what listens there"."""
    port = free_port()
    result = _serve(files["policy"], files["envoy"], "--http", f"{HOST}:{port}", "--grpc", f"0.0.0.0:{port}")
    err = _refused(result, f"--grpc 0.0.0.0:{port}", f"--http {HOST}:{port}", "its own port")
    assert "stop what listens there" not in err


def test_a_host_name_on_the_compiled_grpc_front_door(files: dict[str, str]) -> None:
    """The compiled door listens on an IP address; a name was a worker's ``ValueError`` traceback."""
    require_compiled_front()
    result = _serve(files["envoy"], "--grpc", f"localhost:{free_port()}", "--front", "compiled")
    _refused(result, "--grpc localhost:", "IP address", "--front python")


def test_an_address_of_no_interface_here(files: dict[str, str]) -> None:
    """``cannot assign``: 192.0.2.1 (TEST-NET-1) is no interface of this host."""
    result = _serve(files["envoy"], "--grpc", "192.0.2.1:50051")
    err = _refused(result, "--grpc 192.0.2.1:50051", "this host", "0.0.0.0")
    assert "stop what listens there" not in err


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("front", ["compiled", "python"])
def test_a_worker_that_cannot_listen_stops_the_service_with_2(
    files: dict[str, str], taken: str, front: str, workers: str
) -> None:
    """The port taken after the supervisor's check: the worker's own bind fails; its line names the
    option, the address and the fix, and the supervisor exits 2 at once (no restart, no traceback)."""
    if front == "compiled":
        require_compiled_front()
    result = _serve(files["envoy"], "--grpc", taken, "--front", front, "--workers", workers, bypass_check=True)
    err = _refused(result, f"--grpc {taken}", "choose another port with --grpc", started=True)
    assert "worker_exited" not in _events(err), err  # never replaced


def test_grpc_without_an_envoy_configuration(files: dict[str, str]) -> None:
    """The issue's third case: ``--grpc`` with a policy file only ran without a gRPC door, silently."""
    address = f"{HOST}:{free_port()}"
    err = _refused(_serve(files["policy"], "--grpc", address), f"--grpc {address}", "Envoy")
    assert "domain" in err  # what makes a YAML file an Envoy configuration


@pytest.mark.parametrize(
    ("options", "missing"),
    [
        (("--front", "python"), "Envoy"),
        (("--envoy-headers", "reference"), "Envoy"),
        (("--envoy-charge", "each"), "Envoy"),
        (("--envoy-merge-domains",), "Envoy"),
        (("--max-descriptors", "8"), "Envoy"),
        (("--grpc-timeout", "2"), "Envoy"),
        (("--spoe-front", "python"), "--spoe"),
        (("--spoe-timeout-idle", "30"), "--spoe"),
        (("--spoe-message", "ratelimit"), "--spoe"),
    ],
)
def test_an_option_that_cannot_take_effect(files: dict[str, str], options: tuple[str, ...], missing: str) -> None:
    """An option whose listener is not served is an error naming what is missing, not ignored."""
    err = _refused(_serve(files["policy"], *options), options[0], missing)
    assert len(err.strip().splitlines()) == 1, err


def test_grpc_max_connections_with_the_python_front_door(files: dict[str, str]) -> None:
    """``--grpc-max-connections`` caps the compiled front door's connections; ``--front python`` has none."""
    result = _serve(files["envoy"], "--grpc", f"{HOST}:{free_port()}", "--front", "python", "--grpc-max-connections", "5")
    _refused(result, "--grpc-max-connections", "--front python")
