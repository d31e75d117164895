"""The Litestar app the real-server tests serve (``uvicorn tests.litestar.app:create_app --factory``):
app-wide rules, routes limited by their ``opt``, a streamed response and an unlimited route, on the
store ``RW_STORE`` names (``memory``: a frozen clock, so counts are exact; else a Redis URL)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from litestar import Litestar, Request, get, post
from litestar.response import Stream

from ratewarden import Limiter, MemoryStore, Rule, context_of
from ratewarden.keys import header
from ratewarden.litestar import RateLimitPlugin, RouteLimit
from ratewarden.stores.base import Store

CHUNKS = 64
CHUNK = bytes(range(256)) * 4  # 1 KiB with every byte value


def frozen() -> float:
    return 6000.0


def make_store() -> Store:
    spec = os.environ.get("RW_STORE", "memory")
    if spec == "memory":
        return MemoryStore(clock=frozen)
    from ratewarden.stores.redis import RedisStore

    return RedisStore(spec, timeout=5.0)


@get("/api/items")
async def items(request: Request[Any, Any, Any]) -> dict[str, int]:
    context = context_of(request.scope)
    return {"remaining": context.decision.remaining if context and context.decision else -1}


@post("/api/orders", opt={"rate_limit": RouteLimit("3/hour", key=header("X-API-Key"))})
async def orders() -> dict[str, bool]:
    return {"ordered": True}


@get("/api/stream")
async def stream() -> Stream:
    async def body() -> AsyncIterator[bytes]:
        for _ in range(CHUNKS):
            yield CHUNK
            await asyncio.sleep(0)

    return Stream(body(), media_type="application/octet-stream")


@get("/limited", opt={"rate_limit": f"{os.environ.get('RW_LIMIT', '100')}/hour"})
async def limited() -> dict[str, bool]:
    return {"ok": True}


@get("/free")
async def free() -> dict[str, bool]:
    return {"ok": True}


def create_app() -> Litestar:
    limiter = Limiter(make_store(), prefix=os.environ.get("RW_PREFIX", "rw"))
    plugin = RateLimitPlugin(limiter=limiter, rules=[Rule("/api/**", "10/hour", name="api")])
    return Litestar([items, orders, stream, limited, free], plugins=[plugin], openapi_config=None)
