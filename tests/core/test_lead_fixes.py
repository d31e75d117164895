"""Regression tests for fixes found by review: dependency headers on Response endpoints, route
templates in Redis hash tags, sync facade inside a running loop."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.fastapi import RateLimit, install
from ratewarden.rules import CompiledRule


def _app(with_install: bool) -> FastAPI:
    limiter = Limiter(MemoryStore())
    app = FastAPI()

    @app.get("/own", dependencies=[Depends(RateLimit("2/min", limiter=limiter))])
    async def own() -> JSONResponse:
        return JSONResponse({"a": 1})

    @app.get("/plain", dependencies=[Depends(RateLimit("2/min", limiter=limiter))])
    async def plain() -> dict[str, int]:
        return {"a": 1}

    if with_install:
        install(app)
    return app


async def _get(app: FastAPI, path: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.get(path)


async def test_install_keeps_headers_on_endpoints_returning_a_response() -> None:
    app = _app(with_install=True)
    own = await _get(app, "/own")
    plain = await _get(app, "/plain")
    assert own.headers.get_list("ratelimit") == ['"GET-/own";r=1;t=' + own.headers["ratelimit"].split("t=")[1]]
    assert len(plain.headers.get_list("ratelimit")) == 1  # not duplicated
    assert plain.headers["x-ratelimit-remaining"] == "1"


async def test_without_install_plain_endpoints_still_get_headers() -> None:
    app = _app(with_install=False)
    plain = await _get(app, "/plain")
    assert plain.headers["x-ratelimit-remaining"] == "1"


def test_route_template_braces_do_not_cut_the_hash_tag() -> None:
    compiled = CompiledRule(Rule("/**", "1/s", name="GET /items/{item_id}"), "rw")
    (key,) = compiled.storage_keys("1.2.3.4")
    tag = key[key.index("{") + 1 : key.index("}")]
    assert "1.2.3.4" in tag  # the client key is inside the tag, so clients spread over slots


async def test_sync_facade_works_inside_a_running_loop() -> None:
    limiter = Limiter(MemoryStore())
    assert limiter.hit_sync("k", "1/min").allowed
    assert limiter.peek_sync("k", "1/min").remaining == 0
    limiter.reset_sync("k", "1/min")
    assert limiter.peek_sync("k", "1/min").remaining == 1
    limiter.clear_sync()
    await asyncio.sleep(0)


def test_refund_of_a_bucket_in_debt_is_arithmetic_not_a_reset() -> None:
    from ratewarden.charges import adjusted_state
    from ratewarden.limits import Limit
    from ratewarden.rates import Rate

    limit = Limit(Rate(5, 60.0, None, 10), "token_bucket_debt")
    state, decision = adjusted_state(limit, (-5.0, 100.0), 100.0, -1.0)
    assert state == (-4.0, 100.0)  # one token back, still in debt: not a full allowance
    assert decision.remaining == 0
    state, _ = adjusted_state(limit, (4.5, 100.0), 100.0, -3.0)
    assert state is None  # refunded past capacity: capped, the key reads as untouched
