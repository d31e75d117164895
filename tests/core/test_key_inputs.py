"""Keys and rates as users pass them (issue 11): storage keys built by one function (so
``Limiter.reset`` reaches what a route-template dependency charged), rates given as generators,
missing key values falling back to the client IP, bad arguments named in the error, and the
trusted ``X-Forwarded-For`` walk (capped, never keyed on a client-supplied entry)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import Depends, FastAPI

import ratewarden
from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.fastapi import RateLimit
from ratewarden.keys import ClientIP, compose, header, path_param
from ratewarden.limiter import storage_key
from ratewarden.policy.bans import Bans
from ratewarden.rates import Rate
from ratewarden.rules import CompiledRule
from tests.core.asgi import http_scope, request
from tests.policy.apps import build_app
from tests.vectors.runner import FakeClock

CLIENT = "203.0.113.7"  # the default client of tests.core.asgi.request


def _items_app(limiter: Limiter, rate: Any) -> FastAPI:
    app = FastAPI()

    @app.get("/items/{item_id}", dependencies=[Depends(RateLimit(rate, limiter=limiter))])
    async def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    return app


# --- one storage-key function (item 5) ---------------------------------------------------------


async def test_reset_after_a_dependency_charge_on_a_templated_route_really_resets() -> None:
    limiter = Limiter(MemoryStore(clock=FakeClock(6000.0)))
    app = _items_app(limiter, "2/min")
    assert [(await request(app, f"/items/{i}")).status for i in range(3)] == [200, 200, 429]
    await limiter.reset(CLIENT, "2/min", namespace="GET /items/{item_id}")
    assert (await request(app, "/items/9")).status == 200
    assert (await limiter.peek(CLIENT, "2/min", namespace="GET /items/{item_id}")).remaining == 1


def test_every_storage_key_comes_from_storage_key() -> None:
    rule = Rule("/**", "5/min", name="GET /items/{item_id}", message_rate="2/s")
    compiled = CompiledRule(rule, "rw")
    limiter = Limiter(prefix="rw")
    (limit,) = rule.limits
    assert compiled.storage_keys("k") == (storage_key("rw", "GET /items/{item_id}", "k", limit.suffix),)
    assert limiter.keys_for("k", limiter.limits("5/min"), "GET /items/{item_id}") == list(compiled.storage_keys("k"))
    (message_limit,) = rule.message_limits
    assert compiled.storage_keys("k", message=True) == (
        storage_key("rw", "GET /items/{item_id}-msg", "k", message_limit.suffix),
    )
    assert Bans._storage(limiter, "k", "until") == storage_key("rw", "ban", "k", "until")
    # Braces in the scope never cut the Redis Cluster hash tag short.
    key = storage_key("rw", "GET /items/{item_id}", "k", "x")
    assert key.count("{") == 1 and key.count("}") == 1


# --- rates given as generators (item 6) --------------------------------------------------------


async def test_rates_given_as_a_generator_work_through_the_dependency() -> None:
    limiter = Limiter(MemoryStore(clock=FakeClock(6000.0)))
    app = _items_app(limiter, (r for r in ["2/min"]))
    assert [(await request(app, f"/items/{i}")).status for i in range(3)] == [200, 200, 429]


async def test_rates_given_as_a_generator_work_through_the_limiter_and_rules() -> None:
    limiter = Limiter(MemoryStore(clock=FakeClock(6000.0)))
    decision = await limiter.hit("k", (r for r in ["2/min", "10/hour"]))
    assert decision.allowed and decision.remaining == 1
    rule = Rule("/**", iter(["1/min"]))
    assert rule.rate == ("1/min",) and len(rule.limits) == 1
    app = RateLimitMiddleware(build_app(), limiter, [rule])
    assert [(await request(app, "/api/x")).status for _ in range(2)] == [200, 429]


def _or_compiled(match: str) -> str:
    """In the mypyc-compiled build a compiled function rejects an argument of the wrong type at
    the call itself, with its own TypeError naming the expected type ("str object expected; got
    None"): also immediate and clear, but worded by mypyc."""
    return f"{match}|object expected; got" if ratewarden.COMPILED else match


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Rule("/x", 5), "rate"),  # type: ignore[arg-type]
        (lambda: Rule("/x", iter([])), "no rate given"),
        (lambda: Rule("/x", [None]), "rate"),  # type: ignore[list-item]
        (lambda: Rule("/x", "1/s", cost="1"), "cost"),  # type: ignore[arg-type]
        (lambda: Rule("/x", "1/s", key=None), "key"),  # type: ignore[arg-type]
        (lambda: RateLimit(None, limiter=Limiter()), "rate"),  # type: ignore[arg-type]
        (lambda: RateLimit(7, limiter=Limiter()), "rate"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_fail_at_construction_naming_the_parameter(call: Any, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=_or_compiled(match)) as info:
        call()
    assert "object is not iterable" not in str(info.value)
    assert "not supported between" not in str(info.value)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((None, "1/s"), "key"),
        (("k", None), "rate"),
        (("k", 3), "rate"),
        (("k", "1/s", "1"), "cost"),
        (("k", "1/s", None), "cost"),
    ],
)
async def test_bad_limiter_arguments_name_the_parameter(args: tuple[Any, ...], match: str) -> None:
    limiter = Limiter()
    with pytest.raises((TypeError, ValueError), match=_or_compiled(match)) as info:
        await limiter.hit(*args)
    assert "object is not iterable" not in str(info.value)
    assert "not supported between" not in str(info.value)


# --- missing key values fall back to the client IP (item 7) ------------------------------------


async def test_path_param_missing_falls_back_to_the_client_ip() -> None:
    key = path_param("user_id")
    assert key(http_scope("/api/x", client=("198.51.100.4", 1))) == "198.51.100.4"
    limiter = Limiter(MemoryStore(clock=FakeClock(6000.0)))
    app = RateLimitMiddleware(build_app(), limiter, [Rule("/api/**", "1/min", key=path_param("user_id"))])
    first = await request(app, "/api/x", client=("198.51.100.4", 1))
    other_client = await request(app, "/api/x", client=("198.51.100.5", 1))
    again = await request(app, "/api/x", client=("198.51.100.4", 1))
    # Two clients without the parameter do not share one bucket.
    assert (first.status, other_client.status, again.status) == (200, 200, 429)


def _none_key(scope: Any) -> None:
    return None


async def _async_none_key(scope: Any) -> None:
    return None


@pytest.mark.parametrize("key", [_none_key, _async_none_key, header("X-Missing", fallback=None),
                                 compose(header("X-A", fallback=None), header("X-B", fallback=None))])
@pytest.mark.parametrize("rules", [1, 2])
async def test_any_missing_key_value_falls_back_to_the_client_ip(key: Any, rules: int) -> None:
    limiter = Limiter(MemoryStore(clock=FakeClock(6000.0)))
    matched = [Rule("/api/**", "1/min", key=key, name=f"r{i}") for i in range(rules)]
    app = RateLimitMiddleware(build_app(), limiter, matched)
    got = [(await request(app, "/api/x", client=(ip, 1))).status for ip in ["198.51.100.4", "198.51.100.5", "198.51.100.4"]]
    assert got == [200, 200, 429]


async def test_missing_ban_key_and_delay_key_fall_back_to_the_client_ip() -> None:
    from ratewarden.policy import PolicyMiddleware, PolicyRule
    from ratewarden.policy.delay import Delay

    limiter = Limiter(MemoryStore())
    rule = PolicyRule("/api/**", "1/min", key=_none_key, name="api", delay=Delay(max_wait=0.01))
    bans = Bans(after=1, duration=60, key=_none_key)
    app = PolicyMiddleware(build_app(), limiter, [rule], bans=bans)
    got = [(await request(app, "/api/x", client=(ip, 1))).status for ip in ["198.51.100.4", "198.51.100.4", "198.51.100.5"]]
    # The second request of .4 is refused and bans .4 only; .5 is a different client.
    assert got == [200, 429, 200]
    assert set(bans.banned()) == {"198.51.100.4"}


# --- trusted X-Forwarded-For walk (item 13) ----------------------------------------------------

PROXY = ClientIP(trusted_proxies=["10.0.0.0/8"])


def _forwarded(peer: str, xff: str | None = None, forwarded: str | None = None) -> dict[str, Any]:
    headers = []
    if xff is not None:
        headers.append(("x-forwarded-for", xff))
    if forwarded is not None:
        headers.append(("forwarded", forwarded))
    return http_scope("/", headers=headers, client=(peer, 1))


def test_every_hop_trusted_keys_on_the_peer_not_the_client_supplied_leftmost_entry() -> None:
    assert PROXY(_forwarded("10.1.2.3", "10.9.9.9, 10.0.0.2")) == "10.1.2.3"
    assert PROXY(_forwarded("10.1.2.3", forwarded="for=10.9.9.9, for=10.0.0.2")) == "10.1.2.3"
    # The usual case is unchanged: the rightmost untrusted hop.
    assert PROXY(_forwarded("10.1.2.3", "1.1.1.1, 5.6.7.8, 10.0.0.2")) == "5.6.7.8"


def test_the_walk_examines_at_most_max_hops() -> None:
    from ratewarden.keys import MAX_FORWARDED_HOPS

    trusted_tail = ", ".join(["10.0.0.1"] * MAX_FORWARDED_HOPS)
    # The client's address lies past the cap: not examined, so the peer is the key.
    assert PROXY(_forwarded("10.1.2.3", f"5.6.7.8, {trusted_tail}")) == "10.1.2.3"
    # Within the cap it is found.
    inside = ", ".join(["10.0.0.1"] * (MAX_FORWARDED_HOPS - 1))
    assert PROXY(_forwarded("10.1.2.3", f"5.6.7.8, {inside}")) == "5.6.7.8"


def _distinct_hops(n: int) -> Iterator[str]:
    for i in range(n):
        yield f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"


def test_a_thousand_trusted_hops_are_not_all_examined() -> None:
    """Not a speed assertion: the cap means the trust checks seen stay bounded."""
    proxy = ClientIP(trusted_proxies=["10.0.0.0/8"])
    hops = list(_distinct_hops(1000))
    proxy(_forwarded("10.255.255.254", ", ".join(hops)))
    proxy(_forwarded("10.255.255.254", forwarded=", ".join(f"for={h}" for h in hops)))
    # Each examined address is cached once: the peer plus at most MAX_FORWARDED_HOPS per header.
    from ratewarden.keys import MAX_FORWARDED_HOPS

    assert len(proxy._trust_cache) <= 1 + MAX_FORWARDED_HOPS


def test_rate_objects_still_accepted_everywhere() -> None:
    rule = Rule("/x", Rate(3, 60.0))
    assert rule.limits[0].rate == Rate(3, 60.0)
    assert Rule("/x", [Rate(3, 60.0), "10/hour"]).rate == (Rate(3, 60.0), "10/hour")


def test_route_template_braces_do_not_cut_the_hash_tag() -> None:
    compiled = CompiledRule(Rule("/**", "1/s", name="GET /items/{item_id}"), "rw")
    (key,) = compiled.storage_keys("1.2.3.4")
    tag = key[key.index("{") + 1 : key.index("}")]
    assert "1.2.3.4" in tag  # the client key is inside the tag, so clients spread over slots
