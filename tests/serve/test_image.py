"""The drop-in image and its Kubernetes example: deploy/kubernetes/ratelimit.yaml's environment and
ConfigMap run as written with ``ratewarden serve --envoy-env`` (the ConfigMap laid out as the kubelet
mounts it, ``..data`` symlink and all, and updated as the kubelet updates it); the Dockerfile builds and
its container answers, where a container tool (docker or podman) can run one, else the test says why
it skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.bench.services import free_port
from ratewarden.serve.envoy_settings import SETTINGS
from tests.servers import wait_until

yaml = pytest.importorskip("yaml")

from .test_envoy_env import OK, OVER, desc, rls_pb2, started  # noqa: E402, F401

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "kubernetes" / "ratelimit.yaml"


def _documents() -> dict[str, Any]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(EXAMPLE.read_text())}


def _container() -> dict[str, Any]:
    container: dict[str, Any] = _documents()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    return container


def _mount(directory: Path, files: dict[str, str]) -> None:
    """Lay ``files`` out as the kubelet mounts (and updates) a ConfigMap: a timestamped directory, the
    ``..data`` symlink swapped to it, and one symlink per key through ``..data``."""
    directory.mkdir(parents=True, exist_ok=True)
    version = f"..{uuid.uuid4().hex[:8]}"
    (directory / version).mkdir()
    for name, text in files.items():
        (directory / version / name).write_text(text)
    (directory / "..data_tmp").symlink_to(version)
    os.replace(directory / "..data_tmp", directory / "..data")
    for name in files:
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(f"..data/{name}")


def test_the_kubernetes_example_runs_with_its_environment(
    tmp_path: Path, redis_standalone: Any, started: Any  # noqa: F811
) -> None:
    container = _container()
    env = {item["name"]: str(item["value"]) for item in container["env"]}
    assert set(env) <= set(SETTINGS), set(env) - set(SETTINGS)  # every variable is the reference's
    assert container["command"] == ["/bin/ratelimit"] and "/bin/ratelimit" in (ROOT / "Dockerfile").read_text()
    mount = container["volumeMounts"][0]["mountPath"]
    assert mount == f"{env['RUNTIME_ROOT']}/{env['RUNTIME_SUBDIRECTORY']}/config"
    config = _documents()["ConfigMap"]["data"]["config.yaml"]
    domain = f"rl{uuid.uuid4().hex[:8]}"
    data = tmp_path / "data"
    _mount(data / "ratelimit" / "config", {"config.yaml": config.replace("domain: rl", f"domain: {domain}")})
    env.update(RUNTIME_ROOT=str(data), REDIS_URL=f"127.0.0.1:{redis_standalone.port}",
               PROMETHEUS_ADDR=f"127.0.0.1:{free_port()}")
    server = started(env).up()
    pair = rls_pb2.RateLimitRequest(domain=domain, descriptors=[desc(("source_cluster", "proxy"), ("destination_cluster", "mock"))])
    first, second = server.call(pair), server.call(pair)
    assert (first.overall_code, second.overall_code) == (OK, OVER)
    assert [h.key for h in second.response_headers_to_add] == ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]
    _mount(data / "ratelimit" / "config", {"config.yaml": config.replace("domain: rl", f"domain: {domain}").replace(
        "requests_per_unit: 1\n", "requests_per_unit: 100\n")})  # kubectl apply of a changed ConfigMap
    wait_until(lambda: server.events("reloaded"), 20, "the reload on the ConfigMap's update")
    assert server.call(pair).overall_code == OK
    assert server.stop() == 0


def _container_tool() -> str:
    for tool in ("podman", "docker"):
        path = shutil.which(tool)
        if path is None:
            continue
        probe = subprocess.run([path, "info"], capture_output=True, text=True, timeout=60)
        if probe.returncode == 0:
            return path
        pytest.skip(f"{tool} is installed but cannot run containers here ({tool} info: "
                    f"{(probe.stderr or probe.stdout).strip().splitlines()[-1][:200]})")
    pytest.skip("no container tool (podman or docker) on PATH: the image is not built here")


def test_the_image_builds_and_answers_as_the_reference(tmp_path: Path) -> None:
    tool = _container_tool()
    tag = f"ratewarden-test:{uuid.uuid4().hex[:8]}"
    built = subprocess.run([tool, "build", "-t", tag, str(ROOT)], capture_output=True, text=True, timeout=3600)
    assert built.returncode == 0, built.stderr[-3000:]
    config = tmp_path / "ratelimit" / "config"
    config.mkdir(parents=True)
    (config / "config.yaml").write_text(_documents()["ConfigMap"]["data"]["config.yaml"])
    port = free_port()
    name = f"ratewarden-test-{uuid.uuid4().hex[:8]}"
    run = [tool, "run", "-d", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:8080", "-v", f"{tmp_path}:/data:ro",
           "-e", "RUNTIME_ROOT=/data", "-e", "RUNTIME_SUBDIRECTORY=ratelimit", "-e", "RUNTIME_WATCH_ROOT=false",
           tag, "--envoy-env", "--store", "memory://"]
    assert subprocess.run(run, capture_output=True, text=True, timeout=120).returncode == 0
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthcheck", timeout=2).text == "OK"
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "the container's /healthcheck")
        body = {"domain": "rl", "descriptors": [{"entries": [{"key": "source_cluster", "value": "proxy"},
                                                             {"key": "destination_cluster", "value": "mock"}]}]}
        codes = [httpx.post(f"http://127.0.0.1:{port}/json", json=body, timeout=5).status_code for _ in range(2)]
        assert codes == [200, 429]
        version = subprocess.run([tool, "run", "--rm", tag, "--version"], capture_output=True, text=True, timeout=120)
        assert "gRPC front door: compiled" in version.stdout, version.stdout
    finally:
        subprocess.run([tool, "rm", "-f", name], capture_output=True, timeout=60)
        subprocess.run([tool, "rmi", "-f", tag], capture_output=True, timeout=120)
