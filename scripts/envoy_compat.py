"""``ratewarden serve`` beside envoyproxy/ratelimit (the reference), on the reference's own fixtures
at the commit of the reference binary (issues 30 and 38).

The reference is pinned: ``ratewarden.bench.gateway_peers.REFERENCE_VERSION`` is the version the gateway
bench builds (``go install github.com/envoyproxy/ratelimit/src/service_cmd@<version>``), the binary must
report it (``go version -m``), and the fixtures (its YAML configurations) are read from that module
version in Go's module cache (``go mod download -json github.com/envoyproxy/ratelimit@<version>``).

Each valid configuration is loaded into the reference and into one ``ratewarden serve`` per
configuration compared (``--configs``), on one local Redis; the same ``ShouldRateLimit`` requests are
sent to all with the published Envoy API client (xds-protos), and every answer is compared with the
reference's: the gRPC status, ``overall_code``, each status's ``code``, ``current_limit``,
``limit_remaining`` and ``duration_until_reset`` (1 s of slack), and the headers (names
case-insensitive, a reset within 1 s). Prints, for each configuration, the identical answers out of
all answers and every other one (the ones ratewarden keeps on purpose named with the reason: ``KEPT``);
writes every answer as JSON.

The configurations of ratewarden:

* ``defaults``: ``ratewarden serve FILES`` (Redis db 1, its rejection cache off);
* ``envoy-env``: ``ratewarden serve --envoy-env`` with the reference's own environment (the same
  variables and runtime directory; only its ports differ), and ``--store`` naming the same Redis;
* ``match``: ``ratewarden serve FILES --envoy-charge each --envoy-merge-domains --envoy-headers
  reference`` (``none`` with ``--reference-headers off``).

The requests (scripts/envoy_compat_requests.py) are built from each configuration's descriptors. Redis
is flushed before each sequence, so sequences are independent; a sequence touching a per-second limit
starts at the top of a second. Each ratewarden has its own Redis database and its rejection cache off
(``?cache=0``): a flush empties Redis, not a local cache of what was over (``--envoy-env`` would map the
reference's ``LOCAL_CACHE_SIZE_IN_BYTES=0`` to ratewarden's default, the cache on).

    .venv/bin/python scripts/envoy_compat.py [--configs defaults,envoy-env] [--reference-headers on|off]
        [--build] [--reference BIN] [--source DIR] [--json OUT]
"""

# ruff: noqa
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from envoy_compat_requests import KEPT, Node, Unit, malformed, sequences, walk
from ratewarden.bench.gateway_peers import REFERENCE_MODULE, REFERENCE_VERSION, _go_tool, _module_version

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODULE = "github.com/envoyproxy/ratelimit"
CONFIGS = ("envoy-env", "defaults", "match")

#: The reference's valid fixtures, each served alone (a scenario), and what the reference needs for it.
SCENARIOS: list[tuple[str, list[str], dict[str, str]]] = [
    ("examples/config.yaml", ["examples/ratelimit/config/config.yaml"], {}),
    ("examples/example.yaml", ["examples/ratelimit/config/example.yaml"], {}),
    ("test/basic_config.yaml", ["test/config/basic_config.yaml"], {}),
    ("test/shadowmode_config.yaml", ["test/config/shadowmode_config.yaml"], {}),
    ("test/share_threshold.yaml", ["test/config/share_threshold.yaml"], {}),
    ("test/wildcard.yaml", ["test/config/wildcard.yaml"], {}),
    ("test/metadata.yaml", ["test/config/metadata.yaml"], {}),
    ("test/merge_domain_key1+2.yaml", ["test/config/merge_domain_key1.yaml", "test/config/merge_domain_key2.yaml"],
     {"MERGE_DOMAIN_CONFIG": "true"}),
    ("integration/basic.yaml", ["test/integration/runtime/current/ratelimit/config/basic.yaml"], {}),
    ("integration/another.yaml", ["test/integration/runtime/current/ratelimit/config/another.yaml"], {}),
    ("integration/share_threshold.yaml", ["test/integration/runtime/current/ratelimit/config/share_threshold.yaml"], {}),
    ("integration/reload.yaml", ["test/integration/runtime/current/ratelimit/reload.yaml"], {}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned_source() -> Path:
    """The reference's source tree at ``REFERENCE_VERSION``, from Go's module cache (downloaded through
    the module proxy when missing)."""
    go = shutil.which("go")
    if go is None:
        sys.exit(f"no `go` on PATH: the fixtures are read from {MODULE}@{REFERENCE_VERSION} in Go's module cache")
    done = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{REFERENCE_VERSION}"], capture_output=True,
                          text=True, timeout=600, cwd=tempfile.gettempdir(), env={**os.environ, "GOFLAGS": "-mod=mod"})
    found = json.loads(done.stdout or "{}") if done.stdout.strip().startswith("{") else {}
    if done.returncode != 0 or not found.get("Dir"):
        sys.exit(f"`go mod download {MODULE}@{REFERENCE_VERSION}` failed: {(found.get('Error') or done.stderr)[-300:]}")
    return Path(found["Dir"])


def reference_binary(given: Path | None, build: bool) -> Path:
    """The reference's ``service_cmd`` at ``REFERENCE_VERSION`` (``given``, or found/built as the bench does)."""
    if given is None:
        found, why = _go_tool("service_cmd", REFERENCE_MODULE, build, lambda line: print(line, file=sys.stderr),
                              REFERENCE_VERSION)
        if not found:
            sys.exit(f"no reference binary: {why}" + ("" if build else " (or give --build)"))
        return Path(found)
    version = _module_version(str(given))
    if f" {REFERENCE_VERSION})" not in version:
        sys.exit(f"{given} is{version or ' of an unknown version'}, not {REFERENCE_VERSION}: the fixtures would not "
                 f"be the binary's (`go install {REFERENCE_MODULE}@{REFERENCE_VERSION}`, or give --source)")
    return given


# ---------------------------------------------------------------- services


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes] | None
    grpc_port: int
    log: Path
    stub: Any = None
    channel: Any = None
    refused: str = ""

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_ready(service: Service, timeout: float = 60.0) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}")
    deadline = time.monotonic() + timeout
    while True:
        if service.process is not None and service.process.poll() is not None:
            channel.close()
            text = service.log.read_text(errors="replace").strip().splitlines()
            service.refused = (text[-1] if text else f"exit status {service.process.returncode}")[:300]
            return
        try:
            grpc.channel_ready_future(channel).result(timeout=0.5)
            break
        except grpc.FutureTimeoutError:
            if time.monotonic() > deadline:
                channel.close()
                service.refused = "not ready in time"
                return
    service.channel = channel
    service.stub = rls_pb2_grpc.RateLimitServiceStub(channel)


def reference_env(runtime: Path, redis_port: int, headers: bool, extra: dict[str, str]) -> dict[str, str]:
    """The reference's environment for a runtime directory; ``--envoy-env`` gets the same, with its own ports."""
    return {
        "PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"),
        "USE_STATSD": "false", "DISABLE_STATS": "true", "LOG_LEVEL": "warn",
        "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": f"127.0.0.1:{redis_port}",
        "RUNTIME_ROOT": str(runtime), "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
        "RUNTIME_WATCH_ROOT": "false", "LIMIT_RESPONSE_HEADERS_ENABLED": "true" if headers else "false",
        **extra, **ports(),
    }


def ports() -> dict[str, str]:
    return {"GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(free_port()), "HOST": "127.0.0.1", "PORT": str(free_port()),
            "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(free_port())}


def start(name: str, command: list[str], env: dict[str, str] | None, grpc_port: int, work: Path) -> Service:
    log = work / f"{name}.log"
    process = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=work)
    service = Service(name, process, grpc_port, log)
    wait_ready(service)
    return service


def start_all(args: argparse.Namespace, files: list[Path], extra: dict[str, str], redis_port: int,
              work: Path) -> tuple[Service, dict[str, Service]]:
    """The reference and one ratewarden per configuration, serving ``files``."""
    runtime = work / "runtime"
    config = runtime / "ratelimit" / "config"
    config.mkdir(parents=True)
    for index, f in enumerate(files):
        shutil.copy(f, config / f"{index}-{f.name}")
    env = reference_env(runtime, redis_port, args.reference_headers == "on", extra)
    ref = start("reference", [str(args.reference)], env, int(env["GRPC_PORT"]), work)
    ours: dict[str, Service] = {}
    serve = [str(ROOT / ".venv/bin/ratewarden"), "serve"]
    for name in args.configs:
        db = CONFIGS.index(name)  # each its own database (the reference's is 0: its keys are named otherwise)
        store = ["--store", f"redis://127.0.0.1:{redis_port}/{db}?cache=0"]
        if name == "envoy-env":
            own = {**env, **ports()}
            ours[name] = start(name, [*serve, "--envoy-env", *store], own, int(own["GRPC_PORT"]), work)
            continue
        grpc_port = free_port()
        command = [*serve, *map(str, files), "--grpc", f"127.0.0.1:{grpc_port}", "--http", f"127.0.0.1:{free_port()}",
                   *store, "--watch", "0", "--log-level", "warning", *match_options(args, name)]
        ours[name] = start(name, command, None, grpc_port, work)
    return ref, ours


def match_options(args: argparse.Namespace, name: str) -> list[str]:
    if name != "match":
        return []
    return ["--envoy-charge", "each", "--envoy-merge-domains",
            "--envoy-headers", "reference" if args.reference_headers == "on" else "none"]


# ---------------------------------------------------------------- answers


def call(service: Service, request: Any) -> dict[str, Any]:
    if service.stub is None:
        return {"error": "NOT_SERVED", "detail": service.refused}
    try:
        answer = service.stub.ShouldRateLimit(request, timeout=10)
    except grpc.RpcError as exc:
        return {"error": exc.code().name, "detail": exc.details()}
    statuses = []
    for s in answer.statuses:
        status: dict[str, Any] = {"code": rls_pb2.RateLimitResponse.Code.Name(s.code), "limit_remaining": s.limit_remaining}
        if s.HasField("current_limit"):
            status["current_limit"] = {
                "name": s.current_limit.name, "requests_per_unit": s.current_limit.requests_per_unit,
                "unit": Unit.Name(s.current_limit.unit),
            }
        if s.HasField("duration_until_reset"):
            status["duration_until_reset"] = s.duration_until_reset.seconds
        statuses.append(status)
    return {
        "overall_code": rls_pb2.RateLimitResponse.Code.Name(answer.overall_code),
        "statuses": statuses,
        "headers": [[h.key, h.value] for h in answer.response_headers_to_add],
    }


def near(a: Any, b: Any) -> bool:
    return a is not None and b is not None and abs(int(a) - int(b)) <= 1


def differences(ref: dict[str, Any], rw: dict[str, Any]) -> list[str]:
    """The kinds of difference between two answers (empty: identical)."""
    if "error" in ref or "error" in rw:
        if rw.get("error") == "NOT_SERVED":
            return ["not served (ratewarden refused the configuration)"]
        if ref.get("error") != rw.get("error"):
            return ["gRPC status"]
        return []
    kinds: list[str] = []
    if ref["overall_code"] != rw["overall_code"]:
        kinds.append("overall_code")
    if len(ref["statuses"]) != len(rw["statuses"]):
        kinds.append("statuses (count)")
    for a, b in zip(ref["statuses"], rw["statuses"]):
        if a["code"] != b["code"]:
            kinds.append("status code")
        if a.get("current_limit") != b.get("current_limit"):
            kinds.append("current_limit")
        if a["limit_remaining"] != b["limit_remaining"]:
            kinds.append("limit_remaining")
        ra, rb = a.get("duration_until_reset"), b.get("duration_until_reset")
        if (ra is None) != (rb is None) or (ra is not None and not near(ra, rb)):
            kinds.append("duration_until_reset")
    ha = {k.lower(): v for k, v in ref["headers"]}
    hb = {k.lower(): v for k, v in rw["headers"]}
    if set(ha) != set(hb) or any(
        ha[k] != hb[k] and not ("reset" in k and ha[k].isdigit() and hb[k].isdigit() and near(ha[k], hb[k]))
        for k in ha
    ):
        kinds.append("headers")
    return sorted(set(kinds))


def top_of_second() -> None:
    now = time.time()
    time.sleep(1.0 - (now % 1.0) + 0.02)


def kept(result: dict[str, Any], name: str) -> bool:
    """An answer ratewarden gives otherwise on purpose: its INVALID_ARGUMENT for a request ``KEPT`` names."""
    return (result["sequence"] in KEPT and result["differences"][name] == ["gRPC status"]
            and result["answers"][name].get("error") == "INVALID_ARGUMENT")


def run_scenario(args: argparse.Namespace, name: str, files: list[Path], extra: dict[str, str], redis_port: int,
                 work: Path, loads: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
    nodes: list[Node] = []
    domain = ""
    for f in files:
        document = yaml.safe_load(f.read_text())
        domain = document["domain"]
        walk(document.get("descriptors"), [], nodes)
    seqs = sequences(domain, nodes) + (malformed(domain) if name == SCENARIOS[0][0] else [])
    ref, ours = start_all(args, files, extra, redis_port, work)
    loads.append({"scenario": name, "reference": ref.refused or "served",
                  **{c: s.refused or "served" for c, s in ours.items()}})
    try:
        for seq in seqs:
            # A sequence that crossed a window's boundary (a second's for per-second limits, a minute's
            # for any: a loaded machine is slow) compared counts of two windows: it runs again, up to twice.
            for attempt in range(3):
                subprocess.run(["redis-cli", "-p", str(redis_port), "flushall"], check=True, stdout=subprocess.DEVNULL)
                if seq.per_second:
                    top_of_second()
                started = time.time()
                rows = []
                for index, request in enumerate(seq.requests):
                    a = call(ref, request)
                    answers = {c: call(s, request) for c, s in ours.items()}
                    rows.append({
                        "scenario": name, "sequence": seq.what, "step": index,
                        "request": json.loads(_request_json(request)), "reference": a, "answers": answers,
                        "differences": {c: differences(a, b) for c, b in answers.items()},
                    })
                ended = time.time()
                crossed = int(started // 60) != int(ended // 60) or (seq.per_second and int(started) != int(ended))
                if not crossed or attempt == 2:
                    break
            results.extend(rows)
    finally:
        ref.stop()
        for s in ours.values():
            s.stop()


def summary(name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    identical = [r for r in results if not r["differences"][name]]
    on_purpose = [r for r in results if kept(r, name)]
    other = [r for r in results if r["differences"][name] and not kept(r, name)]
    return {
        "answers": len(results), "identical": len(identical), "different": len(results) - len(identical),
        "kept": [{"scenario": r["scenario"], "sequence": r["sequence"], "reason": KEPT[r["sequence"]],
                  "reference": r["reference"].get("error") or r["reference"]["overall_code"],
                  "ratewarden": r["answers"][name]["error"]} for r in on_purpose],
        "other": len(other),
        "kinds": dict(Counter(k for r in other for k in r["differences"][name]).most_common()),
        "other_sequences": dict(Counter(f"{r['scenario']}: {r['sequence']}" for r in other)),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    source: Path = args.source
    redis_port = free_port()
    work_root = Path(tempfile.mkdtemp(prefix="envoy-compat-"))
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(work_root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    results: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    skipped: list[str] = []
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", redis_port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        for name, rel, extra in SCENARIOS:
            files = [source / r for r in rel]
            if not all(f.is_file() for f in files):
                skipped.append(name)
                continue
            work = work_root / name.replace("/", "_")
            work.mkdir()
            run_scenario(args, name, files, extra, redis_port, work, loads, results)
    finally:
        redis.terminate()
        redis.wait()
        shutil.rmtree(work_root, ignore_errors=True)
    return {
        "reference": str(args.reference), "reference_version": _module_version(str(args.reference)).strip(" ()"),
        "pinned": REFERENCE_VERSION, "source": str(source), "reference_headers": args.reference_headers,
        "scenarios": [s[0] for s in SCENARIOS if s[0] not in skipped], "not_in_source": skipped,
        "configs": {c: {"options": ["--envoy-env"] if c == "envoy-env" else match_options(args, c), **summary(c, results)}
                    for c in args.configs},
        "loads": loads, "results": results,
    }


def _request_json(request: Any) -> str:
    from google.protobuf import json_format

    return json_format.MessageToJson(request, indent=None)


def report(out: dict[str, Any]) -> None:
    print(f"reference {out['reference']} ({out['reference_version']}; pinned {out['pinned']}), "
          f"LIMIT_RESPONSE_HEADERS_ENABLED={'true' if out['reference_headers'] == 'on' else 'false'}")
    print(f"fixtures from {out['source']}: {len(out['scenarios'])} configurations"
          + (f" (not at this commit: {', '.join(out['not_in_source'])})" if out["not_in_source"] else ""))
    for load in out["loads"]:
        if any(v != "served" for k, v in load.items() if k != "scenario"):
            print(f"  load {load['scenario']}: " + "; ".join(f"{k} {v}" for k, v in load.items() if k != "scenario"))
    for name, c in out["configs"].items():
        print(f"{name} ({' '.join(c['options']) or 'no option'}): {c['identical']} of {c['answers']} answers identical; "
              f"{len(c['kept'])} kept on purpose, {c['other']} other differences")
        for k in c["kept"]:
            print(f"  kept: {k['scenario']}: {k['sequence']}: {k['ratewarden']}, the reference {k['reference']} "
                  f"({k['reason']})")
        for kind, count in c["kinds"].items():
            print(f"  {count:4d} answers differ in {kind}")
        for what, count in sorted(c["other_sequences"].items()):
            print(f"  differs: {what}: {count}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="defaults,envoy-env",
                        help=f"ratewarden's configurations to compare, comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--match", action="store_true", help="the same as --configs match")
    parser.add_argument("--source", type=Path, default=None,
                        help=f"envoyproxy/ratelimit's source tree (default: {MODULE}@{REFERENCE_VERSION}, Go's module cache)")
    parser.add_argument("--reference", type=Path, default=None,
                        help="its service_cmd, at the pinned version (default: found or built as the gateway bench does)")
    parser.add_argument("--build", action="store_true", help="go install the pinned reference when it is missing")
    parser.add_argument("--reference-headers", choices=("on", "off"), default="on",
                        help="LIMIT_RESPONSE_HEADERS_ENABLED for the reference (default on)")
    parser.add_argument("--json", type=Path, default=Path("envoy-compat.json"), help="where to write every answer")
    args = parser.parse_args()
    args.configs = ["match"] if args.match else [c.strip() for c in args.configs.split(",") if c.strip()]
    if not args.configs or set(args.configs) - set(CONFIGS):
        parser.error(f"--configs: each of {', '.join(CONFIGS)}")
    if args.source is None:
        args.source = pinned_source()
        args.reference = reference_binary(args.reference, args.build)
    elif args.reference is None:
        parser.error("--source needs --reference (the binary built from that source)")
    out = run(args)
    args.json.write_text(json.dumps(out, indent=1))
    report(out)
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
