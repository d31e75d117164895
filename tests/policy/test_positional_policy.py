"""A policy given where the rules go, ``PolicyMiddleware(app, limiter, policy)``, is the policy (as
``policy=``) on both doors; the plain middlewares refuse it with a message naming ``policy=``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from ratewarden import ConfigurationError, Limiter, MemoryStore, RateLimitMiddleware
from ratewarden.policy import PolicyMiddleware, WSGIPolicyMiddleware
from ratewarden.policy.loader import parse_policy
from ratewarden.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware
from tests.core.asgi import request
from tests.policy.apps import build_app

POLICY = """
version = 1

[[rules]]
name = "api"
path = "/api/**"
rate = "2/min"
"""


def hello(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"hello"]


def wsgi_status(app: Any, path: str) -> int:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "REMOTE_ADDR": "192.0.2.1", "wsgi.url_scheme": "http"}
    started: list[str] = []
    b"".join(app(environ, lambda status, headers, exc_info=None: started.append(status)))
    return int(started[0].split()[0])


@pytest.fixture(params=["path", "str", "Policy"])
def policy(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    file = tmp_path / "policy.toml"
    file.write_text(POLICY)
    return {"path": file, "str": str(file), "Policy": parse_policy(POLICY)}[request.param]


async def test_asgi_policy_middleware_takes_a_positional_policy(policy: Any) -> None:
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy)
    assert [(await request(app, "/api/x")).status for _ in range(3)] == [200, 200, 429]
    assert (await request(app, "/open")).status == 200


def test_wsgi_policy_middleware_takes_a_positional_policy(policy: Any) -> None:
    app = WSGIPolicyMiddleware(hello, Limiter(MemoryStore()), policy)
    assert [wsgi_status(app, "/api/x") for _ in range(3)] == [200, 200, 429]
    assert wsgi_status(app, "/open") == 200


@pytest.mark.parametrize("middleware", [PolicyMiddleware, WSGIPolicyMiddleware])
def test_a_policy_given_twice_is_refused(middleware: Any) -> None:
    policy = parse_policy(POLICY)
    with pytest.raises(ConfigurationError, match=r"given twice.*as policy="):
        middleware(hello, Limiter(MemoryStore()), policy, policy=policy)


@pytest.mark.parametrize("middleware", [RateLimitMiddleware, WSGIRateLimitMiddleware])
@pytest.mark.parametrize("rules", [parse_policy(POLICY), "policy.toml", Path("policy.toml")], ids=["Policy", "str", "path"])
def test_plain_middlewares_name_policy_for_a_policy(middleware: Any, rules: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"rules must be a list of Rule objects, got .*policy=") as raised:
        middleware(hello, Limiter(MemoryStore()), rules)
    assert "not iterable" not in str(raised.value)
