"""``ratewarden bench --gateway`` (bench.gateway): a tiny bounded run of every variant with real
haproxy, nginx, wrk and ``ratewarden serve`` on loopback, asserting the structure and the exactness
columns (never a timing); and the exactness verdicts on made-up samples."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ratewarden.bench.gateway import run
from ratewarden.bench.gateway_load import LoadResult, Plan, Sample
from ratewarden.bench.gateway_report import write
from ratewarden.bench.gateway_rows import GatewayReport, keys_for, round_row
from ratewarden.bench.gateway_setup import GROUPS, VARIANTS, GatewayOptions

LIMITS = {"premium": 12, "standard": 6, "basic": 3}
PER_KEY = 15  # requests per key in the tiny run: every group goes over its limit


def _have_all() -> bool:
    return all(shutil.which(b) or Path(f"/usr/sbin/{b}").exists() for b in ("haproxy", "nginx")) \
        and shutil.which("wrk") is not None


needs_gateways = pytest.mark.skipif(not _have_all(), reason="needs haproxy, nginx and wrk")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[GatewayReport, Path]:
    pytest.importorskip("grpc")
    if not _have_all():
        pytest.skip("needs haproxy, nginx and wrk")
    opts = GatewayOptions(rounds=1, warmup=0, requests=PER_KEY * 3, workers=5, rate=0.0, max_seconds=20.0,
                            keys_per_group=1, limits=LIMITS, capacity=True, capacity_seconds=1.0,
                            capacity_rounds=1, capacity_connections=4)
    report = run(opts, log=lambda _: None)
    out = tmp_path_factory.mktemp("gateway")
    write(out, report)
    return report, out


@needs_gateways
def test_every_variant_ran_with_the_seed_columns(tiny: tuple[GatewayReport, Path]) -> None:
    report, _ = tiny
    assert [v.key for v in report.variants] == list(VARIANTS)
    assert {"haproxy-ratewarden", "haproxy-floor", "haproxy-spoe", "haproxy-spoe-floor"} <= set(VARIANTS)
    for v in report.variants:
        assert v.missing == "", (v.key, v.missing)
        assert len(v.rounds) == 1
        (rnd,) = v.rounds
        assert rnd.requests == PER_KEY * 3 and rnd.unsent == 0
        assert set(rnd.latency_ms) >= {"mean", "p95", "p99"}
        assert rnd.rps > 0
        assert [gr.group for gr in v.groups()] == list(GROUPS)
        for gr in v.groups():
            assert gr.requests == PER_KEY
            assert gr.other == 0, (v.key, gr)
            assert gr.admitted + gr.limited == gr.requests
            assert gr.success_pct == pytest.approx(100.0 * gr.admitted / gr.requests)
        for what in ("rps", "mean", "p95", "p99"):
            low, mid = v.stat(what)  # type: ignore[misc]
            assert low <= mid


@needs_gateways
def test_limiting_rows_are_exact_per_tier(tiny: tuple[GatewayReport, Path]) -> None:
    report, _ = tiny
    for v in report.variants:
        for gr in v.groups():
            if v.limiter in ("none", "floor"):
                assert (gr.admitted, gr.limited, gr.limit, gr.exact) == (PER_KEY, 0, None, "—"), (v.key, gr)
            else:  # exactly the limit admitted, the rest refused with 429
                assert gr.limit == gr.expected == LIMITS[gr.group], (v.key, gr)
                assert (gr.admitted, gr.limited) == (LIMITS[gr.group], PER_KEY - LIMITS[gr.group]), (v.key, gr)
                assert gr.exact == "yes" and not gr.over_limit, (v.key, gr)
        assert not v.over_limit
    limiters = {v.key: (v.limiter, v.rounds != []) for v in report.variants}
    assert limiters["haproxy-spoe"] == limiters["haproxy-ratewarden"] == ("ratewarden", True)
    assert limiters["haproxy-spoe-floor"] == limiters["haproxy-floor"] == ("floor", True)
    exact = [t for t in report.targets if t["target"] == "ratewarden rows exact per tier"]
    assert exact and exact[0]["met"] == "yes"


@needs_gateways
def test_capacity_rows_and_targets(tiny: tuple[GatewayReport, Path]) -> None:
    report, _ = tiny
    assert [(c.protocol, c.server) for c in report.capacity] == [
        ("http", "floor"), ("grpc", "floor"), ("http", "floor-headers"), ("http", "ours"), ("grpc", "ours")]
    for c in report.capacity:
        assert c.missing == "" and len(c.rps_runs) == 1 and c.requests > 0, c
        assert c.bad == 0, c  # every answer a 2xx / OK: the capacity key's limit is never reached
    names = [t["target"] for t in report.targets]
    assert names[:4] == ["HAProxy + ratewarden (Lua): added p99", "HAProxy + ratewarden (Lua): average latency",
                         "HAProxy + ratewarden (SPOE): added p99", "HAProxy + ratewarden (SPOE): average latency"]
    spoe = {t["target"]: t for t in report.targets if "(SPOE)" in t["target"]}
    assert all(t["ours"] is not None and t["floor"] is not None for t in spoe.values()), spoe
    assert sum("service capacity" in n for n in names) == 6  # HTTP against both floors, gRPC against one
    with_headers = [t for t in report.targets if t["target"].endswith("floor with the same headers")]
    assert len(with_headers) == 2 and all(t.get("floor_abs") for t in with_headers)
    for t in report.targets:
        assert {"target", "rule", "direction", "ours", "ours_min", "ours_max", "floor", "floor_min", "floor_max",
                "met"} <= set(t)
        assert "met_min" not in t  # a best round is never judged beside the median
        assert t["met"] in ("yes", "NO", "within noise", "n/a"), t
        if t["unit"]:
            assert t["ours"] is not None, t
            assert (t["floor"] is None) == ("no floor on its stack" in t["rule"]), t  # a floor only on its stack
            assert t["ours_min"] <= t["ours"] <= t["ours_max"], t
    assert "--http-front python" in report.service  # the stack of the Lua row's floor
    grpc = {c.server: c.stack for c in report.capacity if c.protocol == "grpc"}
    assert grpc["ours"].split(":")[0] == grpc["floor"].split(":")[0] == "grpc.aio"  # the floor's stack


@needs_gateways
def test_outputs(tiny: tuple[GatewayReport, Path]) -> None:
    _, out = tiny
    data = json.loads((out / "results.json").read_text())
    assert [v["key"] for v in data["variants"]] == list(VARIANTS)
    assert data["options"]["limits"] == LIMITS
    with (out / "summary.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(VARIANTS) * (len(GROUPS) + 1)
    native = {r["group"]: r for r in rows if r["variant"] == "haproxy-native"}
    assert native["basic"]["admitted"] == "3" and native["basic"]["limit"] == "3" and native["basic"]["exact"] == "yes"
    assert native["all"]["over_limit"] == "False"
    with (out / "capacity.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 5
    md = (out / "report.md").read_text()
    for needle in ("## Verdict", "## Targets", "admitted / limit", "success rate", "| basic | 15 |", "Service capacity"):
        assert needle in md
    html = (out / "report.html").read_text()
    assert "<svg" in html and "<script" not in html


def _result(oks: list[int], n: int) -> tuple[Plan, LoadResult]:
    """Made-up answers: key i (one per group) got ``oks[i]`` 200s, then 429s, of ``n`` each."""
    plan = Plan(keys_for("x", 0, 1), n * 3)
    res = LoadResult(seconds=1.0)
    for k, ok in enumerate(oks):
        res.samples += [Sample(k, 200 if i < ok else 429, 0.001) for i in range(n)]
    return plan, res


def test_exactness_verdicts() -> None:
    limits = {"premium": 10, "standard": 5, "basic": 2}
    rw = VARIANTS["haproxy-ratewarden"]
    plan, res = _result([10, 4, 3], 12)  # exact, under, over
    row = round_row(0, rw, plan, res, limits)
    verdicts = {gr.group: gr.exact for gr in row.groups}
    assert verdicts == {"premium": "yes", "standard": "NO", "basic": "⚠ over"}
    assert [gr.over_limit for gr in row.groups] == [False, False, True]
    plan, res = _result([8, 5, 2], 8)  # fewer requests than the premium limit: all of them is exact
    assert all(gr.exact == "yes" for gr in round_row(0, rw, plan, res, limits).groups)
    # nginx limit_req leaks: 60 r/m over a 1 s run lets one more through, "within", not over
    leaky = VARIANTS["nginx-limit_req"]
    plan, res = _result([12, 5, 2], 12)
    row = round_row(0, leaky, plan, res, {"premium": 60, "standard": 5, "basic": 2})
    assert row.groups[0].exact == "yes"
    plan, res = _result([12, 6, 2], 12)
    row = round_row(0, leaky, plan, res, {"premium": 60, "standard": 5, "basic": 2})
    assert row.groups[1].exact == "⚠ over"  # 5 r/m leaks nothing in 1 s
    none = round_row(0, VARIANTS["haproxy"], *_result([12, 12, 12], 12))
    assert [gr.exact for gr in none.groups] == ["—"] * 3 and none.groups[0].limit is None


def test_nginx_leaky_bucket_within() -> None:
    leaky = VARIANTS["nginx-limit_req"]
    plan, res = _result([61, 5, 2], 70)
    res.seconds = 2.0  # 60 r/m leaks 2 more in 2 s: 61 admitted is within its allowance of 62
    row = round_row(0, leaky, plan, res, {"premium": 60, "standard": 5, "basic": 2})
    assert row.groups[0].exact == "within" and row.groups[0].allowance == 62 and not row.groups[0].over_limit


def test_cli_rejects_an_unknown_variant(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "ratewarden.cli", "bench", "--gateway", "--gateway-variants",
                           "haproxy,nope", "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown --gateway-variants nope" in proc.stderr


def test_the_headers_floor_answers_what_an_allowed_check_answers(tmp_path: Path) -> None:
    """``gateway_floor --headers`` writes the header list ``/check`` answers for the capacity key: the
    same names in the same order, values of the same length (within a digit), so that the floor
    pays what any answer carrying them pays."""
    import asyncio

    from ratewarden import Limiter, MemoryStore
    from ratewarden.bench import gateway_procs as gp
    from ratewarden.bench.gateway_floor import DECISION_HEADERS, headers_floor_app
    from ratewarden.policy import load_policy
    from ratewarden.serve.http import ServeApp

    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(gp.policy_toml({}))
    app = ServeApp(Limiter(MemoryStore()), load_policy(str(policy_file)))
    headers = [(b"x-api-key", gp.BULK_KEY.encode()), (b"x-original-uri", b"/bucket/object")]
    scope = {"type": "http", "path": "/check", "method": "GET", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}

    async def answer(asgi: Any) -> list[tuple[bytes, bytes]]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        async def receive() -> dict[str, Any]:
            return {"type": "http.request"}

        await asgi(dict(scope), receive, send)
        assert sent[0]["status"] == 200
        return list(sent[0]["headers"])

    ours, floor = asyncio.run(answer(app)), asyncio.run(answer(headers_floor_app))
    assert floor == DECISION_HEADERS
    assert [name for name, _ in ours] == [name for name, _ in floor]
    assert all(abs(len(a) - len(b)) <= 1 for (_, a), (_, b) in zip(ours, floor, strict=True)), (ours, floor)


# ---------------------------------------------------------------------------------------------- SPOE floor

def _str(raw: bytes) -> bytes:
    from ratewarden.serve.spop import encode_varint

    return encode_varint(len(raw)) + raw


def _haproxy_frame(kind: int, stream_id: int, frame_id: int, payload: bytes) -> bytes:
    """A frame as HAProxy sends it (FIN set)."""
    from ratewarden.serve.spop import encode_varint

    body = bytes((kind,)) + (1).to_bytes(4, "big") + encode_varint(stream_id) + encode_varint(frame_id) + payload
    return len(body).to_bytes(4, "big") + body


def _haproxy_hello(healthcheck: bool = False) -> bytes:
    from ratewarden.serve.spop import HAPROXY_HELLO, encode_varint

    payload = (_str(b"supported-versions") + b"\x08" + _str(b"2.0") + _str(b"max-frame-size") + b"\x03"
               + encode_varint(16380) + _str(b"capabilities") + b"\x08" + _str(b"pipelining"))
    if healthcheck:
        payload += _str(b"healthcheck") + b"\x11"
    return _haproxy_frame(HAPROXY_HELLO, 0, 0, payload)


def _notify(stream_id: int, frame_id: int, api_key: str) -> bytes:
    """spoe.conf's ``check`` message: method, uri (pathq), headers (req.hdrs_bin), ip (src)."""
    from ratewarden.serve.spop import NOTIFY

    headers = _str(b"host") + _str(b"api") + _str(b"x-api-key") + _str(api_key.encode()) + _str(b"") + _str(b"")
    args = (_str(b"method") + b"\x08" + _str(b"GET") + _str(b"uri") + b"\x08" + _str(b"/bucket/object")
            + _str(b"headers") + b"\x09" + _str(headers) + _str(b"ip") + b"\x06" + bytes((127, 0, 0, 1)))
    return _haproxy_frame(NOTIFY, stream_id, frame_id, _str(b"check") + bytes((4,)) + args)


def _set_vars(payload: bytes) -> list[tuple[str, Any]]:
    """An ACK's SET-VAR actions as (name, value): unsigned integers and strings (all an answer sets)."""
    from ratewarden.serve.spop import SCOPE_TRANSACTION, decode_varint

    def string(at: int) -> tuple[bytes, int]:
        n, at = decode_varint(payload, at)
        return payload[at : at + n], at + n

    out: list[tuple[str, Any]] = []
    at = 0
    while at < len(payload):
        assert payload[at : at + 3] == bytes((1, 3, SCOPE_TRANSACTION)), payload[at:]
        name, at = string(at + 3)
        kind, at = payload[at] & 0x0F, at + 1
        assert kind in (3, 5, 8), kind  # uint32, uint64, string
        value: Any
        if kind == 8:
            raw, at = string(at)
            value = raw.decode()
        else:
            value, at = decode_varint(payload, at)
        out.append((name.decode(), value))
    return out


async def _spoe_session(port: int, api_key: str) -> dict[str, Any]:
    """Talk to an SPOE agent as HAProxy does: a health check, then HELLO, two pipelined NOTIFYs, DISCONNECT."""
    import asyncio

    from ratewarden.serve import spop

    async def frame(reader: asyncio.StreamReader) -> spop.Frame:
        length = int.from_bytes(await reader.readexactly(4), "big")
        return spop.read_frame(await reader.readexactly(length))

    out: dict[str, Any] = {}
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_haproxy_hello(healthcheck=True))
    hello = await frame(reader)
    out["health"] = (hello.kind, spop.kv_list(hello.payload), await reader.read())  # then the agent closes
    writer.close()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_haproxy_hello())
    hello = await frame(reader)
    out["hello"] = (hello.kind, spop.kv_list(hello.payload))
    writer.write(_notify(7, 1, api_key) + _notify(8, 1, api_key))
    acks = [await frame(reader), await frame(reader)]
    out["acks"] = sorted((a.kind, a.stream_id, a.frame_id) for a in acks)
    out["vars"] = [_set_vars(a.payload) for a in acks]
    writer.write(_haproxy_frame(spop.HAPROXY_DISCONNECT, 0, 0, _str(b"status-code") + b"\x03\x00"
                                + _str(b"message") + b"\x08" + _str(b"normal")))
    bye = await frame(reader)
    out["disconnect"] = (bye.kind, spop.kv_list(bye.payload))
    writer.close()
    return out


def test_the_spoe_floor_answers_what_the_agent_answers_an_allowed_check(tmp_path: Path) -> None:
    """``gateway_floor --spoe`` speaks SPOP as ``ratewarden serve --spoe`` does (health check, HELLO,
    pipelined NOTIFYs, DISCONNECT) and acknowledges every NOTIFY with the variables the agent sets for
    an allowed check of the capacity key: the same names in the same order, values of the same
    length (within a digit)."""
    import asyncio
    import socket

    from ratewarden import Limiter, MemoryStore
    from ratewarden.bench import gateway_procs as gp
    from ratewarden.bench.gateway_floor import SPOE_VARIABLES, start_floor_spoe
    from ratewarden.policy import load_policy
    from ratewarden.serve import spop
    from ratewarden.serve.http import ServeApp
    from ratewarden.serve.spoe import start_spoe

    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(gp.policy_toml({}))
    app = ServeApp(Limiter(MemoryStore()), load_policy(str(policy_file)))

    async def session(start: Any) -> dict[str, Any]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        server = await start(sock)
        try:
            return await asyncio.wait_for(_spoe_session(sock.getsockname()[1], gp.BULK_KEY), 10)
        finally:
            server.close()

    ours = asyncio.run(session(lambda sock: start_spoe(app, sock)))
    floor = asyncio.run(session(start_floor_spoe))
    for got in (ours, floor):
        kind, hello, rest = got["health"]
        assert kind == spop.AGENT_HELLO and hello["version"] == "2.0" and rest == b""
        assert got["hello"][0] == spop.AGENT_HELLO and got["hello"][1]["capabilities"] == "pipelining"
        assert got["acks"] == [(spop.ACK, 7, 1), (spop.ACK, 8, 1)]
        assert got["disconnect"] == (spop.AGENT_DISCONNECT, {"status-code": 0, "message": "normal"})
    assert floor["vars"] == [SPOE_VARIABLES, SPOE_VARIABLES]
    allowed = ours["vars"][0]
    assert [name for name, _ in allowed] == [name for name, _ in SPOE_VARIABLES], allowed
    assert allowed[0] == ("status", 200)
    assert all(abs(len(str(a)) - len(str(b))) <= 1 for (_, a), (_, b) in zip(allowed, SPOE_VARIABLES, strict=True)), \
        (allowed, SPOE_VARIABLES)


def test_floor_and_serve_commands_take_an_spoe_port() -> None:
    from ratewarden.bench import gateway_procs as gp

    # the python agent is named: the default (auto) runs the compiled one where it imports
    assert gp.serve_command([Path("p.toml")], 1, spoe=3)[-4:] == ["--spoe", "127.0.0.1:3", "--spoe-front", "python"]
    assert "--spoe" not in gp.serve_command([Path("p.toml")], 1)
    assert "--http-front" not in gp.serve_command([Path("p.toml")], 1)
    assert gp.serve_command([Path("p.toml")], 1, http_front="python")[-2:] == ["--http-front", "python"]
    assert "--front" not in gp.serve_command([Path("p.toml")], 1, grpc=2)
    assert gp.serve_command([Path("p.toml")], 1, grpc=2, grpc_front="python")[-2:] == ["--front", "python"]
    assert gp.serve_command([Path("p.toml")], 1, spoe=3, spoe_front="compiled")[-4:] == [
        "--spoe", "127.0.0.1:3", "--spoe-front", "compiled"]
    argv = gp.floor_command(0, spoe=3)
    assert "--http" not in argv and argv[-2:] == ["--spoe", "3"]
    files = gp.haproxy_spoe_files(8100, 8182, 9100)
    assert set(files) == {"haproxy.cfg", "spoe.conf"}
    assert "127.0.0.1:8182" in files["haproxy.cfg"] and "127.0.0.1:8082" not in files["haproxy.cfg"]
    assert "config spoe.conf" in files["haproxy.cfg"]


def test_the_grpc_floor_answers_every_call_allowed_without_python_and_keeps_the_bounds() -> None:
    """``gateway_floor --grpc-front``: the compiled front door answers each well-formed call allowed,
    one counted-looking status per descriptor, with nothing taking requests on the Python side (the
    queue stays empty); a request over the descriptor bound is still refused as ``ratewarden serve``
    refuses it."""
    import asyncio

    pytest.importorskip("grpc")
    pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
    from ratewarden.serve.front import compiled_module

    if compiled_module()[0] is None:
        pytest.skip(f"the compiled front door is not built: {compiled_module()[1]}")
    import grpc  # type: ignore[import-untyped, unused-ignore]
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped, unused-ignore]

    from ratewarden.bench import gateway_procs as gp
    from ratewarden.bench.gateway_floor import fixed_front
    from ratewarden.serve import bounds

    port = gp.free_port()
    front = fixed_front(port)

    async def calls() -> tuple[Any, grpc.RpcError]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            request = rls_pb2.RateLimitRequest(domain="any")
            for value in ("a", "b"):
                entry = request.descriptors.add().entries.add()
                entry.key, entry.value = "k", value
            answers = await asyncio.gather(*(stub.ShouldRateLimit(request, timeout=10) for _ in range(50)))
            too_many = rls_pb2.RateLimitRequest(domain="any")
            for _ in range(bounds.MAX_DESCRIPTORS + 1):
                too_many.descriptors.add().entries.add(key="k", value="v")
            with pytest.raises(grpc.RpcError) as refused:
                await stub.ShouldRateLimit(too_many, timeout=10)
            return answers, refused.value

    try:
        answers, refused = asyncio.run(calls())
        assert front.pending() == 0  # nothing was queued for Python
    finally:
        front.close()
    ok = rls_pb2.RateLimitResponse.OK
    for answer in answers:
        assert answer.overall_code == ok and len(answer.statuses) == 2
        assert all(s.code == ok and s.current_limit.requests_per_unit == 1_000_000_000 and s.limit_remaining
                   and s.duration_until_reset.seconds == 3600 for s in answer.statuses)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {bounds.MAX_DESCRIPTORS} descriptors" in (refused.details() or "")
