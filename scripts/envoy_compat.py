"""``ratewarden serve`` beside envoyproxy/ratelimit (the reference), on the reference's own fixtures
(issue 30): each valid configuration is loaded into both services on one local Redis (the
reference in db 0, ratewarden in db 1, its rejection cache off), the same ``ShouldRateLimit``
requests are sent to both with the published Envoy API client (xds-protos), and every answer is
compared: the gRPC status, ``overall_code``, each status's ``code``, ``current_limit``,
``limit_remaining`` and ``duration_until_reset`` (1 s of slack), and the headers (names
case-insensitive, a reset within 1 s). Prints a summary, writes every answer and difference as JSON.

The requests are built from each configuration's descriptors: every descriptor alone (one unit,
up to its limit, one over), a cost larger than what is left then one unit, every pair of limited
descriptors together until the first is over then the second alone, an override, an unknown
domain, and malformed requests. Redis is flushed before each sequence, so sequences are
independent; a sequence touching a per-second limit starts at the top of a second.

    .venv/bin/python scripts/envoy_compat.py [--match] [--source DIR] [--reference BIN] [--json OUT]

``--match`` starts ratewarden with the options that answer as the reference does
(``--envoy-charge each --envoy-headers reference --envoy-merge-domains``; ``--envoy-headers none``
with ``--reference-headers off``). ``--source`` is envoyproxy/ratelimit's source tree (default: the
newest in the Go module cache); ``--reference`` its ``service_cmd`` (default ``~/go/bin/service_cmd``,
from ``GOFLAGS=-mod=mod go install github.com/envoyproxy/ratelimit/src/service_cmd@latest``).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
UNIT_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800, "month": 2592000, "year": 31536000}
Unit = rls_pb2.RateLimitResponse.RateLimit.Unit

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


def default_source() -> Path:
    found = sorted((Path.home() / "go/pkg/mod/github.com/envoyproxy").glob("ratelimit@*"))
    if not found:
        sys.exit("no envoyproxy/ratelimit source: run go install github.com/envoyproxy/ratelimit/src/service_cmd@latest")
    return found[-1]


# ---------------------------------------------------------------- requests


@dataclass
class Node:
    """A descriptor of a configuration, with the entries of a request that reaches it."""

    entries: list[tuple[str, str]]
    requests_per_unit: int | None  # None: no rate_limit, or unlimited
    unit: str
    unlimited: bool = False
    shadow: bool = False
    quota: bool = False


def walk(descriptors: list[dict[str, Any]] | None, prefix: list[tuple[str, str]], out: list[Node]) -> None:
    for d in descriptors or []:
        value = str(d.get("value", "") or "")
        instance = value.replace("*", "x1") if value else f"v{len(out)}"
        entries = [*prefix, (str(d["key"]), instance)]
        rl = d.get("rate_limit") or {}
        unlimited = bool(rl.get("unlimited", False))
        rpu = None if (not rl or unlimited) else int(rl.get("requests_per_unit", 0))
        out.append(Node(entries, rpu, str(rl.get("unit", "")).lower(), unlimited,
                        bool(d.get("shadow_mode", False)), bool(d.get("quota_mode", False))))
        walk(d.get("descriptors"), entries, out)


def desc(entries: list[tuple[str, str]], limit: tuple[int, str] | None = None, hits: int | None = None) -> Any:
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if limit is not None:
        d.limit.requests_per_unit = limit[0]
        d.limit.unit = Unit.Value(limit[1].upper())
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return d


@dataclass
class Sequence:
    """Requests sent in order after a flush; ``what`` names what it exercises."""

    what: str
    requests: list[Any]
    per_second: bool = False


def req(domain: str, descriptors: list[Any], hits: int = 0) -> Any:
    return rls_pb2.RateLimitRequest(domain=domain, descriptors=descriptors, hits_addend=hits)


def sequences(domain: str, nodes: list[Node]) -> list[Sequence]:
    out: list[Sequence] = []
    limited = [n for n in nodes if n.requests_per_unit is not None]
    for n in nodes:
        name = "/".join(f"{k}={v}" for k, v in n.entries)
        d = [desc(n.entries)]
        sec = n.unit == "second"
        if n.requests_per_unit is None:
            out.append(Sequence(f"single {name} ({'unlimited' if n.unlimited else 'no limit'})", [req(domain, d)]))
            continue
        rpu = n.requests_per_unit
        kind = "shadow " if n.shadow else "quota " if n.quota else ""
        if rpu == 0:
            out.append(Sequence(f"single {kind}{name} (0/{n.unit})", [req(domain, d), req(domain, d)], sec))
            continue
        steps = [1] + ([rpu - 1] if rpu > 1 else []) + [1]
        out.append(Sequence(f"single {kind}{name} ({rpu}/{n.unit}) up to and over", [req(domain, d, h) for h in steps], sec))
        out.append(Sequence(f"single {kind}{name} ({rpu}/{n.unit}) cost over what is left, then 1",
                            [req(domain, d, rpu + 1), req(domain, d, 1)], sec))
    for a, b in zip(limited, limited[1:]):
        assert a.requests_per_unit is not None
        pair = [desc(a.entries), desc(b.entries)]
        an = "/".join(f"{k}={v}" for k, v in a.entries)
        bn = "/".join(f"{k}={v}" for k, v in b.entries)
        sec = "second" in (a.unit, b.unit)
        out.append(Sequence(
            f"pair {an} + {bn}: the first to its limit, over, then the second alone",
            [req(domain, pair, max(1, a.requests_per_unit)), req(domain, pair, 1), req(domain, [desc(b.entries)], 1)],
            sec,
        ))
    if limited:
        n = limited[0]
        over = [desc(n.entries, limit=(3, "minute"))]
        out.append(Sequence(f"override 3/minute on {n.entries}", [req(domain, over, 3), req(domain, over, 1)]))
        out.append(Sequence(f"per-descriptor hits_addend 0 on {n.entries}", [req(domain, [desc(n.entries, hits=0)])],
                            n.unit == "second"))
    return out


def malformed(domain: str) -> list[Sequence]:
    return [
        Sequence("unknown domain", [req("no-such-domain", [desc([("k", "v")])])]),
        Sequence("empty domain", [req("", [desc([("k", "v")])])]),
        Sequence("no descriptors", [req(domain, [])]),
        Sequence("an entry with an empty key", [req(domain, [desc([("", "v")])])]),
        Sequence("a descriptor with no entries", [req(domain, [desc([])])]),
    ]


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


def start_reference(binary: Path, files: list[Path], env_extra: dict[str, str], redis_port: int, work: Path,
                    headers: bool) -> Service:
    runtime = work / "reference"
    config = runtime / "ratelimit" / "config"
    config.mkdir(parents=True)
    for index, f in enumerate(files):
        shutil.copy(f, config / f"{index}-{f.name}")
    grpc_port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"),
        "USE_STATSD": "false", "DISABLE_STATS": "true", "LOG_LEVEL": "warn",
        "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": f"127.0.0.1:{redis_port}",
        "RUNTIME_ROOT": str(runtime), "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true",
        "RUNTIME_WATCH_ROOT": "false",
        "GRPC_HOST": "127.0.0.1", "GRPC_PORT": str(grpc_port), "HOST": "127.0.0.1", "PORT": str(free_port()),
        "DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": str(free_port()),
        "LIMIT_RESPONSE_HEADERS_ENABLED": "true" if headers else "false",
        **env_extra,
    }
    log = work / "reference.log"
    process = subprocess.Popen([str(binary)], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    service = Service("reference", process, grpc_port, log)
    wait_ready(service)
    return service


def start_ratewarden(files: list[Path], redis_port: int, work: Path, options: list[str]) -> Service:
    grpc_port = free_port()
    command = [
        str(ROOT / ".venv/bin/ratewarden"), "serve", *map(str, files),
        "--grpc", f"127.0.0.1:{grpc_port}", "--http", f"127.0.0.1:{free_port()}",
        "--store", f"redis://127.0.0.1:{redis_port}/1?cache=0", "--watch", "0", "--log-level", "warning",
        *options,
    ]
    log = work / "ratewarden.log"
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=work)
    service = Service("ratewarden", process, grpc_port, log)
    wait_ready(service)
    return service


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


def run(args: argparse.Namespace) -> dict[str, Any]:
    source: Path = args.source
    redis_port = free_port()
    work_root = Path(tempfile.mkdtemp(prefix="envoy-compat-"))
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(work_root)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    options: list[str] = []
    if args.match:
        options = ["--envoy-charge", "each", "--envoy-merge-domains",
                   "--envoy-headers", "reference" if args.reference_headers == "on" else "none"]
    results: list[dict[str, Any]] = []
    loads: list[dict[str, Any]] = []
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", redis_port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        for name, rel, env_extra in SCENARIOS:
            files = [source / r for r in rel]
            if not all(f.is_file() for f in files):
                print(f"skip {name}: not in {source}", file=sys.stderr)
                continue
            work = work_root / name.replace("/", "_")
            work.mkdir()
            nodes: list[Node] = []
            domain = ""
            for f in files:
                document = yaml.safe_load(f.read_text())
                domain = document["domain"]
                walk(document.get("descriptors"), [], nodes)
            seqs = sequences(domain, nodes)
            if name == SCENARIOS[0][0]:
                seqs += malformed(domain)
            ref = start_reference(args.reference, files, env_extra, redis_port, work, args.reference_headers == "on")
            rw = start_ratewarden(files, redis_port, work, options)
            loads.append({"scenario": name, "reference": ref.refused or "served", "ratewarden": rw.refused or "served"})
            try:
                for seq in seqs:
                    subprocess.run(["redis-cli", "-p", str(redis_port), "flushall"], check=True, stdout=subprocess.DEVNULL)
                    if seq.per_second:
                        top_of_second()
                    for index, request in enumerate(seq.requests):
                        a = call(ref, request)
                        b = call(rw, request)
                        results.append({
                            "scenario": name, "sequence": seq.what, "step": index,
                            "request": json.loads(_request_json(request)),
                            "reference": a, "ratewarden": b, "differences": differences(a, b),
                        })
            finally:
                ref.stop()
                rw.stop()
    finally:
        redis.terminate()
        redis.wait()
        shutil.rmtree(work_root, ignore_errors=True)
    kinds = Counter(k for r in results for k in r["differences"])
    identical = sum(not r["differences"] for r in results)
    but_headers = sum(r["differences"] == ["headers"] for r in results)
    return {
        "reference": str(args.reference), "source": str(source), "match": args.match,
        "reference_headers": args.reference_headers, "ratewarden_options": options,
        "answers": len(results), "identical": identical, "different": len(results) - identical,
        "identical_but_headers": identical + but_headers,
        "kinds": dict(kinds.most_common()), "loads": loads, "results": results,
    }


def _request_json(request: Any) -> str:
    from google.protobuf import json_format

    return json_format.MessageToJson(request, indent=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--match", action="store_true", help="start ratewarden with the options matching the reference")
    parser.add_argument("--source", type=Path, default=None, help="envoyproxy/ratelimit's source tree")
    parser.add_argument("--reference", type=Path, default=Path.home() / "go/bin/service_cmd", help="its service_cmd")
    parser.add_argument("--reference-headers", choices=("on", "off"), default="on",
                        help="LIMIT_RESPONSE_HEADERS_ENABLED for the reference (default on)")
    parser.add_argument("--json", type=Path, default=Path("envoy-compat.json"), help="where to write every answer")
    args = parser.parse_args()
    args.source = args.source or default_source()
    report = run(args)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"reference {report['reference']} (fixtures from {report['source']})")
    print(f"ratewarden options: {' '.join(report['ratewarden_options']) or '(defaults)'}")
    for load in report["loads"]:
        if load["reference"] != "served" or load["ratewarden"] != "served":
            print(f"  load {load['scenario']}: reference {load['reference']}; ratewarden {load['ratewarden']}")
    print(f"{report['identical']} of {report['answers']} answers identical, {report['different']} different "
          f"({report['identical_but_headers']} identical but for their headers)")
    for kind, count in report["kinds"].items():
        print(f"  {count:4d} answers differ in {kind}")
    by_sequence = Counter((r["scenario"], r["sequence"]) for r in report["results"] if r["differences"])
    if by_sequence:
        print("sequences with differences:")
        for (scenario, what), count in sorted(by_sequence.items()):
            print(f"  {scenario}: {what}: {count}")
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
