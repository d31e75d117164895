"""In-process driver: direct ASGI calls (no HTTP client, no socket), so only the app and the limiter are timed."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from ..apps import ASGIApp
from ..results import Run, summarize_latencies
from ..scenarios import Scenario

__all__ = ["RequestSpec", "plan", "run_iteration"]

CLIENT = ("127.0.0.1", 50000)
SERVER = ("127.0.0.1", 8000)

@dataclass(frozen=True)
class RequestSpec:
    """One request to send: method, path (with query), extra headers, body, and the result group it counts in."""

    method: str
    path: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes = b""
    group: str = ""

def _spec(sc: Scenario, path: str, client_id: str | None, extra: tuple[tuple[bytes, bytes], ...] = (),
          group: str = "") -> RequestSpec:
    headers: list[tuple[bytes, bytes]] = [(b"host", b"bench")]
    if client_id is not None:
        headers.append((b"x-client-id", client_id.encode()))
    if sc.body:
        headers += [(b"content-type", sc.content_type.encode()), (b"content-length", str(len(sc.body)).encode())]
    headers += extra
    return RequestSpec(sc.method, path, tuple(headers), sc.body, group)

def plan(sc: Scenario) -> list[list[RequestSpec]]:
    """The requests of one iteration as independent sequences (one per client); order within each matters."""
    if sc.tiers:
        per = [
            [_spec(sc, sc.path, f"{t.name}-key", ((b"x-api-tier", t.name.encode()),), t.name)
             for _ in range(t.requests)]
            for t in sc.tiers
        ]
        # Interleave the groups so every tier sees the same load profile.
        flat = [r for row in zip(*per, strict=False) for r in row]
        return [flat]
    if sc.mode == "clients":
        return [[_spec(sc, sc.path, f"client-{c}")] * sc.requests for c in range(sc.clients)]
    if sc.identity == "many":
        seq = [_spec(sc, sc.path, f"user-{i}") for i in range(sc.requests)]
    else:
        one = _spec(sc, sc.path, "hot-key-user" if sc.identity == "header" else None)
        seq = [one] * sc.requests
    seq += [_spec(sc, "/unthrottled", None)] * sc.exempt_requests
    return [seq]

def _scope(spec: RequestSpec) -> dict[str, Any]:
    path, _, query = spec.path.partition("?")
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": spec.method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(),
        "root_path": "", "headers": list(spec.headers), "client": CLIENT, "server": SERVER,
    }

async def call(app: ASGIApp, spec: RequestSpec) -> int:
    """Send one request straight into the ASGI app; return the response status (0 if none was sent)."""
    status = 0
    sent_body = False

    async def receive() -> MutableMapping[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": spec.body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(_scope(spec), receive, send)
    return status

async def _ws_session(app: ASGIApp, messages: int, out: list[tuple[str, float, str]]) -> None:
    inbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    scope = {"type": "websocket", "asgi": {"version": "3.0"}, "http_version": "1.1", "scheme": "ws",
             "path": "/ws", "raw_path": b"/ws", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"bench")], "client": CLIENT, "server": SERVER, "subprotocols": []}
    await inbox.put({"type": "websocket.connect"})
    task = asyncio.ensure_future(app(scope, inbox.get, outbox.put))
    try:
        first = await outbox.get()
        if first["type"] != "websocket.accept":
            out.extend(("error", 0.0, "") for _ in range(messages))
            return
        for i in range(messages):
            t0 = perf_counter()
            await inbox.put({"type": "websocket.receive", "text": f'{{"n":{i}}}'})
            reply = await outbox.get()
            ms = (perf_counter() - t0) * 1000
            if reply["type"] != "websocket.send":
                out.append(("error", ms, ""))
                break
            out.append(("rate_limit" if "rate_limit" in (reply.get("text") or "") else "ok", ms, ""))
    finally:
        await inbox.put({"type": "websocket.disconnect", "code": 1000})
        await asyncio.wait_for(task, 5)

async def run_iteration(app: ASGIApp, sc: Scenario, concurrency: int | None = None) -> Run:
    """Run one timed iteration of ``sc`` against ``app``; wall time includes everything sent."""
    results: list[tuple[str, float, str]] = []
    width = concurrency or sc.concurrency
    t_start = perf_counter()
    if sc.mode == "ws":
        await asyncio.gather(*(_ws_session(app, sc.requests, results) for _ in range(sc.connections)))
    else:
        sequences = plan(sc)

        async def one(spec: RequestSpec) -> None:
            t0 = perf_counter()
            try:
                code = str(await call(app, spec))
            except Exception:
                code = "error"
            results.append((code, (perf_counter() - t0) * 1000, spec.group))

        async def sequential(seq: list[RequestSpec]) -> None:
            for spec in seq:
                await one(spec)

        if sc.mode in ("sequential", "clients") or (sc.mode == "batches" and width <= 1):
            await asyncio.gather(*(sequential(seq) for seq in sequences))
        elif sc.mode == "all_at_once":
            await asyncio.gather(*(one(spec) for seq in sequences for spec in seq))
        else:
            flat = [spec for seq in sequences for spec in seq]
            for i in range(0, len(flat), width):
                await asyncio.gather(*(one(spec) for spec in flat[i:i + width]))
    duration = perf_counter() - t_start
    return _to_run(results, duration)

def _to_run(results: list[tuple[str, float, str]], duration: float) -> Run:
    status = Counter(code for code, _, _ in results)
    errors = status.pop("error", 0)
    groups: dict[str, dict[str, float]] = {}
    for name in sorted({g for _, _, g in results if g}):
        mine = [(c, ms) for c, ms, g in results if g == name]
        ok = sum(1 for c, _ in mine if c.startswith("2"))
        groups[name] = {
            "requests": len(mine),
            "avg_ms": sum(ms for _, ms in mine) / len(mine),
            "limited": sum(1 for c, _ in mine if c == "429"),
            "success_pct": 100.0 * ok / len(mine),
        }
    return Run(
        requests=len(results),
        duration_s=duration,
        status=dict(status),
        latency_ms=summarize_latencies([ms for code, ms, _ in results if code != "error"]),
        errors=errors,
        groups=groups,
    )

Hook = Callable[[], Awaitable[None]]
