"""The gateway bench's peer rows (``ratewarden bench --gateway``): gRPC ``ShouldRateLimit`` of
``ratewarden serve`` (Python grpc server, and the compiled front door) beside envoyproxy/ratelimit,
the Go service Envoy's docs point to, on loopback.

* **Peers built when Go is present:** ``go install`` of ``github.com/envoyproxy/ratelimit/src/service_cmd``
  at ``REFERENCE_VERSION`` (the reference, pinned: scripts/envoy_compat.py reads its fixtures at the
  same commit; a binary of another version is rebuilt) and ``github.com/bojand/ghz/cmd/ghz`` (the load
  generator, the same for every service), cached in Go's bin folder (``~/go/bin``); without Go, or when the build fails, the rows
  that need them are reported missing with the reason.
* **The same Redis, YAML and load for all:** one private redis-server, ``CONFIG`` (``over``: 100/second,
  mostly refused; ``under``: 1e9/hour; ``exact``: 50/minute per value), ghz with 50 streams per
  connection, ``requests`` calls per cell after a warm-up.
* **Per cell:** req/s, p50, p99 (ghz), CPU per decision of the service's processes and of redis-server
  (utime + stime from ``/proc``, before and after, over the calls answered).
* **Exactness:** each time a service starts, 200 concurrent calls against a fresh 50/minute descriptor
  (the floor excepted: it limits nothing).
* **The floor:** the compiled front door answering every call allowed without asking Python
  (``gateway_floor --grpc-front``): what no decision made behind that door can beat, so each target
  is read beside it.
* **Interleaved:** every round starts each service once (order rotated) and runs its cells, so a busy
  machine slows each alike; ratios to the reference are taken within a round.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import gateway_procs as gp
from .gateway_peer_rows import EXACT_LIMIT
from .services import redis_server

__all__ = ["CONFIG", "INSTANCES", "REFERENCE_MODULE", "REFERENCE_VERSION", "Instance", "PeerOptions", "Tools",
           "cpu_seconds", "find_tools", "protoset"]

CALL = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
REFERENCE_MODULE = "github.com/envoyproxy/ratelimit/src/service_cmd"
#: The reference's version, pinned (commit 3fb702589d36): the bench builds it, scripts/envoy_compat.py
#: compares against it and reads its fixtures (test/, examples/) from this module version.
REFERENCE_VERSION = "v1.4.1-0.20260122083618-3fb702589d36"
GHZ_MODULE = "github.com/bojand/ghz/cmd/ghz"
CONFIG = f"""\
domain: bench
descriptors:
  - key: generic_key
    value: over
    rate_limit: {{unit: second, requests_per_unit: 100}}
  - key: generic_key
    value: under
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
  - key: exact
    rate_limit: {{unit: minute, requests_per_unit: {EXACT_LIMIT}}}
"""


@dataclass(frozen=True)
class Instance:
    """One service started once per round, and the cells (scenario, ghz connections) it runs."""

    service: str  # python | front | front-same | reference | floor
    store: str  # redis | memory | none (the floor)
    workers: int
    cells: tuple[tuple[str, int], ...]


INSTANCES = (
    Instance("python", "redis", 1, (("over", 1), ("under", 1))),
    Instance("front", "redis", 1, (("over", 1), ("under", 1), ("under", 4))),
    Instance("front-same", "redis", 1, (("over", 1), ("under", 1), ("under", 4))),
    Instance("reference", "redis", 1, (("over", 1), ("under", 1), ("under", 4))),
    Instance("front", "redis", 2, (("under", 4),)),
    Instance("python", "memory", 1, (("over", 1), ("under", 1))),
    Instance("front-same", "memory", 1, (("over", 1), ("under", 1))),
    Instance("floor", "none", 1, (("under", 1), ("under", 4))),
)


@dataclass
class PeerOptions:
    rounds: int = 3
    requests: int = 20000  # calls per cell (ghz -n)
    warmup: int = 500  # calls before each cell, not measured
    build: bool = True  # go install what is missing when Go is present


@dataclass
class Tools:
    """What the peer rows run with, and why a service is skipped (service -> reason; ``all``: every row)."""

    ghz: str = ""
    reference: str = ""
    front: list[str] = field(default_factory=list)  # argv prefix of the compiled front door (ratewarden serve)
    skip: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _go_bin_dirs(go: str | None) -> list[Path]:
    dirs = [Path(p) for p in (os.environ.get("GOBIN"),) if p]
    if go:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([go, "env", "GOBIN", "GOPATH"], capture_output=True, text=True, timeout=30).stdout
            gobin, _, gopath = out.partition("\n")
            dirs += [Path(gobin.strip())] if gobin.strip() else []
            dirs += [Path(gopath.strip().split(os.pathsep)[0]) / "bin"] if gopath.strip() else []
    return [*dirs, Path.home() / "go" / "bin"]


def _go_tool(name: str, module: str, build: bool, log: Callable[[str], None],
             version: str = "latest") -> tuple[str, str]:
    """(path, "") of a Go binary on PATH or in Go's bin folder, built with ``go install`` if missing
    (or, with a pinned ``version``, of another version) and Go is present; ("", why) otherwise."""
    go = shutil.which("go")
    found = shutil.which(name) or next((str(d / name) for d in _go_bin_dirs(go) if os.access(d / name, os.X_OK)), "")
    built = _module_version(found) if found and version != "latest" else ""
    if found and (not built or f" {version})" in built):  # without Go, a version cannot be read
        return found, ""
    if found and not build:
        return "", f"{found} is {built.strip(' ()')}, not {version} (`go install {module}@{version}`)"
    if go is None:
        return "", f"{name} is not built and Go is not installed (no `go` on PATH): install Go to build it " \
                   f"(`go install {module}@{version}`), or put {name} on PATH"
    if not build:
        return "", f"{name} is not built (`go install {module}@{version}`)"
    log(f"peers: building {name} with `go install {module}@{version}` (once, cached in Go's bin folder)")
    try:
        done = subprocess.run([go, "install", f"{module}@{version}"], capture_output=True, text=True, timeout=900,
                              env={**os.environ, "GOFLAGS": "-mod=mod"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"`go install {module}@{version}` failed: {exc}"
    if done.returncode != 0:
        return "", f"`go install {module}@{version}` failed (no network?): {done.stderr.strip()[-300:]}"
    found = next((str(d / name) for d in _go_bin_dirs(go) if os.access(d / name, os.X_OK)), "")
    return (found, "") if found else ("", f"`go install {module}@{version}` left no {name} in Go's bin folder")


def _serve_output(flag: str) -> str:
    """What ``ratewarden serve FLAG`` prints (``--help``: whether it offers ``--front``; ``--version``:
    which front door it runs)."""
    argv = [sys.executable, "-m", "ratewarden.cli", "serve", flag]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
    return ""


def find_tools(opts: PeerOptions, root: Path, log: Callable[[str], None]) -> Tools:
    """ghz, the reference and the compiled front door as far as they can be had, each with why not."""
    tools = Tools()
    try:
        import grpc  # type: ignore[import-untyped, unused-ignore]  # noqa: F401
        from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped, unused-ignore]  # noqa: F401
    except ImportError as exc:
        tools.skip["all"] = f"the serve extra is not installed ({exc}): pip install 'ratewarden[serve]'"
        return tools
    tools.ghz, why = _go_tool("ghz", GHZ_MODULE, opts.build, log)
    if why:
        tools.skip["all"] = f"no load generator: {why}"
        return tools
    tools.reference, why = _go_tool("service_cmd", REFERENCE_MODULE, opts.build, log, REFERENCE_VERSION)
    if why:
        tools.skip["reference"] = f"envoyproxy/ratelimit skipped: {why}"
    if shutil.which(redis_server()) is None:
        tools.skip["redis"] = f"{redis_server()} is not installed (scripts/install-system-deps.sh)"
    tools.front = [*gp.serve_command([], 0)[:4], "--front", "compiled"]
    version = " ".join(_serve_output("--version").split())
    tools.notes.append(f"compiled front door: `ratewarden serve --front compiled` (`serve --version`: {version})")
    if "front door: compiled" not in version:
        tools.skip["front"] = f"compiled front door skipped: `ratewarden serve --version` says {version!r}"
    tools.notes += [f"ghz: {tools.ghz}{_module_version(tools.ghz)}"] + (
        [f"envoyproxy/ratelimit: {tools.reference}{_module_version(tools.reference)} (stats off)"]
        if tools.reference else [])
    return tools


def _module_version(binary: str) -> str:
    """`` (module version)`` of a Go binary, from ``go version -m`` ("" without Go)."""
    go = shutil.which("go")
    if go is None:
        return ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([go, "version", "-m", binary], capture_output=True, text=True, timeout=30).stdout
        mods = [line.split()[1:3] for line in out.splitlines() if line.strip().startswith("mod")]
        return f" ({' '.join(mods[0])})" if mods and len(mods[0]) == 2 else ""
    return ""


def protoset(path: Path) -> None:
    """The RLS service's descriptors (rls.proto and its imports, dependencies first) for ghz's ``--protoset``."""
    from envoy.service.ratelimit.v3 import rls_pb2  # type: ignore[import-untyped, unused-ignore]
    from google.protobuf import descriptor_pb2  # type: ignore[import-untyped, unused-ignore]

    fds = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(fd: object) -> None:
        name = str(getattr(fd, "name"))  # noqa: B009
        if name in seen:
            return
        for dep in getattr(fd, "dependencies"):  # noqa: B009
            add(dep)
        seen.add(name)
        proto = descriptor_pb2.FileDescriptorProto()
        getattr(fd, "CopyToProto")(proto)  # noqa: B009
        fds.file.append(proto)

    add(rls_pb2.DESCRIPTOR)
    path.write_bytes(fds.SerializeToString())


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of ``pids`` and all their descendants (``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError), open(f"/proc/{entry}/stat", encoding="ascii",
                                                                   errors="replace") as f:
                stats[int(entry)] = f.read().rsplit(")", 1)[1].split()
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    total, todo, seen = 0.0, list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += (int(stats[pid][11]) + int(stats[pid][12])) / tick
        todo += children.get(pid, [])
    return total

