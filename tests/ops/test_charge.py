"""After-response charging: checked before the handler, refunded when the status does not count."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

import pytest

from ratewarden import Limiter, MemoryStore
from ratewarden.algorithms import ALGORITHMS
from ratewarden.charges import Charge, adjust
from ratewarden.limits import make_limits
from ratewarden.policy import PolicyMiddleware, parse_policy
from ratewarden.stores.base import Store
from tests.servers import Memcached

from ..policy.apps import build_app, client

POLICY = """
[[rules]]
name = "login"
path = "/login"
methods = ["POST"]
rate = "3/min"
charge = { statuses = [401, "5xx"] }
"""


async def test_only_failed_logins_count() -> None:
    app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=parse_policy(POLICY))
    async with client(app) as http:
        ok = Counter([(await http.post("/login?status=200")).status_code for _ in range(10)])
        failed = Counter([(await http.post("/login?status=401")).status_code for _ in range(5)])
        # Over the limit now: refused before the handler, even for a request that would succeed.
        after = (await http.post("/login?status=200")).status_code
    assert ok == {200: 10}
    assert failed == {401: 3, 429: 2}
    assert after == 429


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_refund_restores_the_allowance(algorithm: str) -> None:
    store = MemoryStore(clock=lambda: 1000.5)
    limits = make_limits("5/min", algorithm)
    keys = ["k"]
    for _ in range(3):
        assert store.hit_now(keys, limits, [1.0]).allowed
    assert (await store.peek(keys, limits))[0].remaining == 2
    await adjust(store, keys, limits, [-2.0])
    assert (await store.peek(keys, limits))[0].remaining == 4
    await adjust(store, keys, limits, [-5.0])  # never more than the whole limit
    assert (await store.peek(keys, limits))[0].remaining == 5
    assert store.hit_now(keys, limits, [5.0]).allowed
    assert not store.hit_now(keys, limits, [1.0]).allowed



def _breaker(store: MemoryStore) -> Store:
    from ratewarden.stores.breaker import Breaker

    return Breaker(store)


@pytest.mark.parametrize("wrap", [lambda store: store, _breaker], ids=["bare", "breaker"])
async def test_a_memory_store_refunds_through_its_own_adjust(wrap: Callable[[MemoryStore], Store]) -> None:
    """No ``isinstance(store, MemoryStore)`` in ``charges``: ``MemoryStore.adjust`` itself refunds,
    called bare, through ``charges.adjust``, or through a wrapper."""
    memory = MemoryStore(clock=lambda: 1000.5)
    store = wrap(memory)
    limits = make_limits("5/min", "gcra")
    for _ in range(4):
        assert memory.hit_now(["k"], limits, [1.0]).allowed
    assert (await store.adjust(["k"], limits, [-1.0]))[0].remaining == 2
    assert (await adjust(store, ["k"], limits, [-1.0]))[0].remaining == 3
    assert memory.adjust_now(["k"], limits, [2.0])[0].remaining == 1  # a penalty, synchronously
    assert memory.adjust_now(["k"], limits, [-9.0])[0].remaining == 5
    assert memory.state_of("k") is None  # the whole limit back: the key is gone


def test_charge_statuses() -> None:
    charge = Charge([401, "5xx", "420-429"])
    assert [charge.counts(s) for s in (200, 401, 404, 425, 500, 599)] == [False, True, False, True, True, True]
    assert Charge.failures().counts(404) and not Charge.failures().counts(302)
    with pytest.raises(ValueError, match="invalid status"):
        Charge(["2xxx"])


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_log", "gcra"])
async def test_after_response_charging_on_memcached(memcached_server: Memcached, algorithm: str) -> None:
    """The same login policy through PolicyMiddleware, with the counters in a real memcached:
    successes are refunded by ``MemcachedStore.adjust``, failures count. (Per hour, so a fixed
    window cannot roll over mid-test.)"""
    from ratewarden.stores.memcached import MemcachedStore

    prefix = f"rwmc{uuid.uuid4().hex[:8]}"
    store = MemcachedStore(memcached_server.url, timeout=5)
    policy = parse_policy(POLICY.replace('rate = "3/min"', f'rate = "3/hour"\nalgorithm = "{algorithm}"'))
    app = PolicyMiddleware(build_app(), Limiter(store, prefix=prefix), policy=policy)
    try:
        async with client(app) as http:
            ok = Counter([(await http.post("/login?status=200")).status_code for _ in range(10)])
            failed = Counter([(await http.post(f"/login?status={s}")).status_code for s in (401, 404, 503, 401, 500)])
            after = (await http.post("/login?status=200")).status_code
        assert ok == {200: 10}  # successes were refunded: never limited
        assert failed == {401: 2, 404: 1, 503: 1, 429: 1}  # 404 is not charged, so 401, 503, 401 fill the limit
        assert after == 429
        # Penalty and reward act on the same memcached counter.
        (stats,) = await app.stats("10.0.0.1")
        assert stats["remaining"] == 0
        assert (await app.reward("login", "10.0.0.1", 2)).remaining == 2
        assert (await app.penalty("login", "10.0.0.1", 1)).remaining == 1
        (stats,) = await app.stats("10.0.0.1")
        assert stats["remaining"] == 1
    finally:
        await store.clear()
        await store.close()


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


class _NoAdjust:
    """A store of one's own that cannot refund: it has no ``adjust`` (``Adjusting``)."""

    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.hit, self.peek, self.reset = self.memory.hit, self.memory.peek, self.memory.reset


def test_charge_on_a_store_that_cannot_refund_fails_at_start_up() -> None:
    from ratewarden.errors import ConfigurationError
    from ratewarden.metrics import InstrumentedStore, Metrics
    from ratewarden.stores import Breaker

    with pytest.raises(ConfigurationError, match=r"rule 'login'.*_NoAdjust cannot"):
        PolicyMiddleware(build_app(), Limiter(_NoAdjust()), policy=parse_policy(POLICY))
    # Wrappers answer for what they wrap.
    assert Breaker(MemoryStore(), fallback=MemoryStore()).supports("adjust")
    assert not Breaker(MemoryStore(), fallback=_NoAdjust()).supports("adjust")
    assert not Breaker(MemoryStore()).supports("local")
    metrics = Metrics()
    try:
        assert not InstrumentedStore(_NoAdjust(), metrics).supports("adjust")
        assert InstrumentedStore(MemoryStore(), metrics).supports("local")
    finally:
        metrics.close()
    PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=parse_policy(POLICY))  # fine


def test_a_reload_the_store_cannot_serve_keeps_the_old_policy(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "policy.toml"
    path.write_text('[[rules]]\nname = "api"\npath = "/api/**"\nrate = "5/min"\n')
    app = PolicyMiddleware(build_app(), Limiter(_NoAdjust()), policy=path)
    path.write_text(POLICY)
    assert app.reload() is False
    assert app.reloader is not None and "cannot" in str(app.reloader.last_error)
    assert [r.name for r in app.rules.rules] == ["api"]


async def test_an_adjust_with_a_limit_the_table_cannot_hold_changes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Every limit is checked before the first key is touched: all or nothing, as a check is."""
    from ratewarden import ConfigurationError
    from ratewarden.stores.shared_memory import SharedMemoryStore
    from tests.shm import unique_name

    store = SharedMemoryStore(unique_name(), max_keys=100, directory=tmp_path, log_size=10)
    fits, too_big = make_limits("5/min", "gcra")[0], make_limits("50/min", "sliding_log")[0]
    assert store.hit_now(["a"], [fits], [3.0]).remaining == 2
    with pytest.raises(ConfigurationError, match="log_size"):
        await store.adjust(["a", "b"], [fits, too_big], [-3.0, 1.0])
    assert (await store.peek(["a"], [fits]))[0].remaining == 2  # not refunded
    await store.close()
