"""A small Starlette app and helpers shared by the policy and operations tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def _ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def _login(request: Request) -> PlainTextResponse:
    status = int(request.query_params.get("status", "200"))
    return PlainTextResponse("login", status_code=status)


def build_app() -> Starlette:
    routes = [
        Route("/api/{rest:path}", _ok),
        Route("/login", _login, methods=["POST"]),
        Route("/export", _ok),
        Route("/search", _ok),
        Route("/health", _ok),
        Route("/open", _ok),
    ]
    return Starlette(routes=routes)


def client(app: Any, ip: str = "10.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(ip, 1234))
    return httpx.AsyncClient(transport=transport, base_url="http://test")


TIERED = """
version = 1
[identity]
sources = ["header:X-API-Key", "bearer", "query:api_key"]
unknown_group = "basic"
anonymous_group = "anonymous"
[identity.keys]
"pk-premium" = "premium"
"sk-standard" = "standard"
"cron" = "internal"
[identity.patterns]
"trial-*" = "basic"
[groups.premium]
limits = ["{premium}/min"]
[groups.standard]
limits = ["{standard}/min"]
[groups.basic]
limits = ["{basic}/min"]
[groups.anonymous]
limits = "3/min"
[groups.internal]
unlimited = true
[[rules]]
path = "/health"
bypass = true
[[rules]]
name = "api"
path = "/api/**"
tiered = true
"""


def tiered_policy(premium: int = 1000, standard: int = 20, basic: int = 5) -> str:
    return TIERED.replace("{premium}", str(premium)).replace("{standard}", str(standard)).replace("{basic}", str(basic))
