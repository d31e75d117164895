"""A store of one's own: ``DictStore``, the example of docs/architecture.md (read from the page, so
the page's store is the one tested), implements ``AsyncStore`` and ``Adjusting`` and nothing else,
with no base class. It passes the shared vectors, admits exactly the limit of concurrent checks
through ``Limiter`` and the ASGI middleware, refunds as ``MemoryStore`` does, and is refused at
start-up where a capability it lacks is needed."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.errors import ConfigurationError
from ratewarden.limits import make_limits
from ratewarden.stores import Breaker
from ratewarden.stores.adapted import as_store
from ratewarden.stores.protocols import AsyncStore, BlockingHit, LocalStore
from ratewarden.wsgi import RateLimitMiddleware as WSGIRateLimitMiddleware
from tests.core.asgi import request
from tests.vectors.runner import FakeClock, run_vectors

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
ALGORITHMS = ["fixed_window", "sliding_window", "sliding_log", "gcra", "token_bucket", "leaky_bucket"]


def _dict_store() -> Callable[..., Any]:
    """``DictStore`` as the page defines it."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    (code,) = [b for b in blocks if "class DictStore" in b]
    namespace: dict[str, Any] = {"__name__": "dict_store"}
    exec(compile(code, str(DOC), "exec"), namespace)
    made: Callable[..., Any] = namespace["DictStore"]
    return made


DictStore = _dict_store()


def test_it_implements_the_async_protocol_and_no_more() -> None:
    store = DictStore()
    assert isinstance(store, AsyncStore)
    assert not isinstance(store, (BlockingHit, LocalStore))
    adapted = Limiter(store).store
    assert adapted.supports("adjust") and not adapted.local and not adapted.can_block("hit")


async def test_the_shared_vectors() -> None:
    assert await run_vectors(lambda clock: as_store(DictStore(clock))) > 40


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_exactly_the_limit_of_concurrent_checks(algorithm: str) -> None:
    limiter = Limiter(DictStore(), fallback=None)
    decisions = await asyncio.gather(*(limiter.hit("client", "100/hour", algorithm=algorithm) for _ in range(150)))
    assert sum(d.allowed for d in decisions) == 100
    assert all(d.retry_after > 0 for d in decisions if not d.allowed)


async def test_the_asgi_middleware_admits_exactly_the_limit() -> None:
    async def hello(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"hello"})

    store = DictStore()
    app = RateLimitMiddleware(hello, limiter=Limiter(store), rules=[Rule("/api/**", "20/min")])
    replies = await asyncio.gather(*(request(app, "/api/x") for _ in range(50)))
    assert sorted(r.status for r in replies) == [200] * 20 + [429] * 30
    assert store.data  # counted in the store of one's own, not in an insurance limiter


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_adjust_answers_as_memory_does(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(1_800_000_000.0)
    own, memory = Limiter(DictStore(clock)).store, MemoryStore(clock=clock)
    limits = [make_limits("10/min", algorithm)[0] for algorithm in ALGORITHMS]
    for _ in range(300):
        clock.advance(rng.choice([0.0, 0.5, 3.0, 20.0]))
        i = rng.randrange(len(limits))
        key, limit, amount = f"k{i}", limits[i], rng.choice([1.0, 2.0, -1.0, -3.0, 12.0])
        if rng.random() < 0.5:
            assert await own.hit([key], [limit], [amount if amount > 0 else 1.0]) == memory.hit_now(
                [key], [limit], [amount if amount > 0 else 1.0])
        else:
            assert await own.adjust([key], [limit], [amount]) == memory.adjust_now([key], [limit], [amount])
        assert await own.peek([key], [limit]) == memory.peek_now([key], [limit])


def test_a_capability_it_lacks_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigurationError, match=r"hit_blocking\); DictStore has no synchronous client"):
        WSGIRateLimitMiddleware(lambda environ, start: [b""], Limiter(DictStore()), [Rule("/**", "1/s")])
    with pytest.raises(ConfigurationError, match=r"fallback=.*needs a store that can answer without I/O"):
        Limiter(MemoryStore(), fallback=DictStore())
    assert not Breaker(MemoryStore(), fallback=DictStore()).can_block("hit")


class _OwnLocal:
    """A local store of one's own: ``AsyncStore`` and ``LocalStore``, over a ``MemoryStore``."""

    def __init__(self) -> None:
        memory = MemoryStore()
        self.hit, self.peek, self.reset, self.adjust = memory.hit, memory.peek, memory.reset, memory.adjust
        self.hit_now, self.peek_now, self.reset_now = memory.hit_now, memory.peek_now, memory.reset_now
        self.adjust_now = memory.adjust_now


def test_a_local_store_of_ones_own_is_decided_without_a_coroutine() -> None:
    from ratewarden.enforcement.check import check
    from ratewarden.rules import CompiledRule

    limiter = Limiter(_OwnLocal())
    store = limiter.store
    assert store.local and store.can_block("hit", "peek", "reset", "adjust") and store.supports("adjust")
    rules = (CompiledRule(Rule("/**", "2/min"), limiter.prefix),)
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "client": ("10.0.0.1", 1)}
    answers = [check(limiter, rules, scope) for _ in range(3)]
    assert [getattr(a, "allowed", None) for a in answers] == [True, True, False]  # decisions, not awaitables
    assert store.peek_blocking(["k"], list(limiter.limits("1/s")))[0].remaining == 1
    assert Limiter(DictStore(), fallback=_OwnLocal()).fallback is not None  # fit for an insurance limiter
