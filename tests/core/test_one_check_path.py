"""One check path (issue 22): ``enforcement.check.check`` decides at once where it can and answers an
awaitable only where it must; the middleware, the FastAPI edge and ``check_rules`` all go through it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi import Depends, FastAPI

from ratewarden import Decision, Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.context import context_for
from ratewarden.enforcement import check as check_module
from ratewarden.enforcement.check import LimitUnavailable, check, check_rules, decided
from ratewarden.fastapi import RateLimit, install
from ratewarden.limits import Limit
from ratewarden.rules import CompiledRule
from ratewarden.scopes import value_of
from tests.core.asgi import http_scope, request

SRC = Path(__file__).resolve().parents[2] / "src" / "ratewarden"


def compiled(limiter: Limiter, *rules: Rule) -> tuple[CompiledRule, ...]:
    return tuple(CompiledRule(rule, limiter.prefix) for rule in rules)


class RemoteStore:
    """A store that asks its server (``local`` is False), with a rejection cache it controls."""

    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.hits = 0
        self.cached: Decision | None = None

    async def hit(self, keys: Sequence[str], limits: Sequence[Limit], costs: Sequence[float]) -> Decision:
        self.hits += 1
        await asyncio.sleep(0)
        return self.memory.hit_now(keys, limits, costs)

    async def peek(self, keys: Sequence[str], limits: Sequence[Limit]) -> list[Decision]:
        return self.memory.peek_now(keys, limits)

    async def reset(self, keys: Sequence[str]) -> None:
        return None

    def cached_rejection(self, keys: Sequence[str], costs: Sequence[float]) -> Decision | None:
        return self.cached


async def test_one_sync_rule_on_a_memory_store_is_decided_at_once() -> None:
    limiter = Limiter(MemoryStore())
    rules = compiled(limiter, Rule("/**", "2/min"))
    answers = [check(limiter, rules, http_scope()) for _ in range(3)]
    assert all(isinstance(a, Decision) for a in answers)
    assert [a.allowed for a in answers if isinstance(a, Decision)] == [True, True, False]


async def test_check_rules_charges_the_same_keys_as_check() -> None:
    limiter = Limiter(MemoryStore())
    rules = compiled(limiter, Rule("/**", ["3/min", "10/hour"]))
    first = check(limiter, rules, http_scope())
    second = await check_rules(limiter, rules, http_scope())
    assert isinstance(first, Decision) and second is not None
    assert (first.remaining, second.remaining) == (2, 1)


async def test_a_sync_key_answering_an_awaitable_is_awaited_once() -> None:
    calls: list[str] = []

    async def lookup() -> str:
        await asyncio.sleep(0)
        return "user-1"

    def key(scope: Any) -> Any:  # a sync key whose fallback is async
        calls.append("key")
        return lookup()

    limiter = Limiter(MemoryStore())
    rules = compiled(limiter, Rule("/**", "1/min", key=key))
    answer = check(limiter, rules, http_scope())
    assert isinstance(answer, Awaitable) and not isinstance(answer, Decision)
    decision = await decided(answer)
    assert decision is not None and decision.allowed and calls == ["key"]
    again = await decided(check(limiter, rules, http_scope(client=("198.51.100.9", 1))))
    assert again is not None and not again.allowed  # the same key, whatever the client IP


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(lambda: (Rule("/**", "5/min"), Rule("/**", "9/min", key=lambda s: "k")), id="two rules"),
        pytest.param(lambda: (Rule("/**", "5/min", cost=lambda s: 2.0),), id="cost function"),
        pytest.param(lambda: (Rule("/**", "5/min", shadow=True), Rule("/**", "9/min")), id="shadow rule"),
    ],
)
async def test_the_step_machine_decides_at_once_on_a_local_store(rules: Any) -> None:
    """Several rules, a cost function, a shadow rule: the core's step machine, whose every step a
    local store answers at once, so no coroutine is made."""
    limiter = Limiter(MemoryStore())
    answer = check(limiter, compiled(limiter, *rules()), http_scope())
    assert isinstance(answer, Decision) and answer.allowed


async def test_an_async_key_must_wait() -> None:
    limiter = Limiter(MemoryStore())
    answer = check(limiter, compiled(limiter, Rule("/**", "5/min", key=_async_key)), http_scope())
    assert isinstance(answer, Awaitable)
    decision = await decided(answer)
    assert decision is not None and decision.allowed


async def _async_key(scope: Any) -> str:
    return "async"


async def test_a_remote_store_answers_a_cached_rejection_at_once() -> None:
    store = RemoteStore()
    limiter = Limiter(store)
    rules = compiled(limiter, Rule("/**", "5/min"))
    answer = check(limiter, rules, http_scope())
    assert not isinstance(answer, Decision) and answer is not None
    assert (await decided(answer)) is not None and store.hits == 1
    store.cached = Decision(False, 5, 0, 30.0, 30.0, 60.0)
    assert check(limiter, rules, http_scope()) is store.cached
    assert store.hits == 1


def _failing_key(scope: Any) -> str:
    raise KeyError("no such header")


async def _failing_fallback() -> str:
    raise RuntimeError("auth service down")


async def test_failures_open_at_once_and_closed_where_they_happen() -> None:
    open_limiter = Limiter(MemoryStore())
    # Fail-open charges the client's address instead of the failing key, at once.
    answer = check(open_limiter, compiled(open_limiter, Rule("/**", "5/min", key=_failing_key)), http_scope())
    assert isinstance(answer, Decision) and answer.allowed and answer.remaining == 4
    closed = Limiter(MemoryStore(), on_error="closed")
    with pytest.raises(LimitUnavailable):  # raised by check itself: nothing to await
        check(closed, compiled(closed, Rule("/**", "5/min", key=_failing_key)), http_scope())
    pending = check(closed, compiled(closed, Rule("/**", "5/min", key=lambda s: _failing_fallback())), http_scope())
    with pytest.raises(LimitUnavailable):  # raised when awaited
        await decided(pending)


async def test_middleware_and_edge_answer_an_async_fallback_key() -> None:
    async def fallback() -> str:
        await asyncio.sleep(0)
        return "shared"

    def key(scope: Any) -> Any:
        return fallback()

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    middleware = RateLimitMiddleware(inner, Limiter(MemoryStore()), [Rule("/**", "1/min", key=key)])
    assert [(await request(middleware, "/x")).status for _ in range(2)] == [200, 429]

    app = FastAPI()

    @app.get("/y", dependencies=[Depends(RateLimit("1/min", key=key, limiter=Limiter(MemoryStore())))])
    async def endpoint() -> dict[str, bool]:
        return {"ok": True}

    install(app)
    assert [(await request(app, "/y")).status for _ in range(2)] == [200, 429]


class PlainMapping(Mapping[str, Any]):
    """A scope that is not a dict (the ASGI types allow any mapping)."""

    def __init__(self, **items: Any) -> None:
        self.items_ = dict(items)

    def __getitem__(self, key: str) -> Any:
        return self.items_[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.items_[key] = value

    def __iter__(self) -> Iterator[str]:
        return iter(self.items_)

    def __len__(self) -> int:
        return len(self.items_)


def test_scopes_read_and_write_any_mapping() -> None:
    scope = PlainMapping(client=("203.0.113.7", 1))
    assert value_of(scope, "client") == ("203.0.113.7", 1)
    assert value_of(scope, "missing", "default") == "default"
    scope["state"] = PlainMapping()
    assert isinstance(value_of(scope, "state"), PlainMapping)
    context = context_for(scope)  # type: ignore[arg-type]
    assert context_for(scope) is context  # type: ignore[arg-type]
    assert value_of({"a": 1}, "a") == 1 and value_of({}, "a", 2) == 2


def test_the_check_layer_has_no_exception_for_control_flow() -> None:
    assert not hasattr(check_module, "KeyPending")
    for name in ("check_now", "check_pending", "can_check_now"):
        assert not hasattr(check_module, name)


