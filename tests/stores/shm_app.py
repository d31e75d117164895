"""The app the multi-worker tests serve with ``uvicorn --workers`` and gunicorn: one route
limited to ``RW_LIMIT`` per hour on ``RW_STORE`` (``memory`` or ``shm:<name>:<directory>``),
on a frozen clock so the expected count is exact."""

from __future__ import annotations

import os
from typing import Any

from fastapi import FastAPI

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.stores.base import Store
from ratewarden.stores.shared_memory import SharedMemoryStore


def frozen() -> float:
    return 6000.0


def make_store() -> Store:
    spec = os.environ.get("RW_STORE", "memory")
    if spec == "memory":
        return MemoryStore(clock=frozen)
    _, name, directory = spec.split(":", 2)
    return SharedMemoryStore(name, max_keys=1000, directory=directory, clock=frozen)


inner = FastAPI()
inner.add_middleware(
    RateLimitMiddleware,
    limiter=Limiter(make_store()),
    rules=[Rule("/limited", f"{os.environ.get('RW_LIMIT', '20')}/hour", key=lambda scope: "everyone")],
)


@inner.get("/limited")
async def limited() -> dict[str, int]:
    return {"pid": os.getpid()}


async def app(scope: Any, receive: Any, send: Any) -> None:
    """Every response, admitted or not, says which worker process answered (``x-pid``)."""

    async def send_with_pid(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"x-pid", str(os.getpid()).encode())]}
        await send(message)

    await inner(scope, receive, send_with_pid)
