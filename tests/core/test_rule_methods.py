"""``Rule(methods=...)``: a string is one method, an unknown name is refused, ``repr`` shows them
(issue 20, defect 4: ``methods="POST"`` became the letters P, O, S, T and the limit never applied)."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.errors import ConfigurationError
from ratewarden.policy.loader import parse_policy


def test_a_string_is_one_method() -> None:
    rule = Rule("/login", "3/min", methods="post")
    assert rule.methods == frozenset({"POST"})
    assert rule.applies("POST", "/login") and not rule.applies("GET", "/login")


def test_a_login_limit_given_as_a_string_applies() -> None:
    async def login(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/login", login, methods=["GET", "POST"])])
    app.add_middleware(RateLimitMiddleware, limiter=Limiter(MemoryStore()), rules=[Rule("/login", "3/min", methods="POST")])
    with TestClient(app) as client:
        statuses = [client.post("/login").status_code for _ in range(5)]
        assert client.get("/login").status_code == 200  # GET is not limited
    assert statuses == [200, 200, 200, 429, 429]


@pytest.mark.parametrize("methods", [["GETT"], "POTS", ["GET", "BREW"], [], [1]])
def test_unknown_or_empty_methods_are_a_configuration_error(methods: object) -> None:
    with pytest.raises(ConfigurationError, match="methods"):
        Rule("/x", "1/s", methods=methods)  # type: ignore[arg-type]


def test_repr_shows_the_methods() -> None:
    assert "methods=['GET', 'HEAD', 'POST']" in repr(Rule("/x", "1/s", methods=["post", "GET"]))  # GET brings HEAD
    assert "methods" not in repr(Rule("/x", "1/s"))


def test_a_policy_file_with_an_unknown_method_names_its_line() -> None:
    text = '[[rules]]\npath = "/login"\nrate = "3/min"\nmethods = ["GETT"]\n'
    with pytest.raises(ValueError, match=r"GETT") as info:
        parse_policy(text, "toml", "policy.toml")
    assert str(info.value).startswith("policy.toml:4: rules[0].methods"), str(info.value)
