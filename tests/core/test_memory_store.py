"""MemoryStore: all-or-nothing, the memory bound under a flood of keys, reclaiming, threads."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ratewarden import Limiter, MemoryStore
from ratewarden.algorithms import ALGORITHMS
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from tests.shm import KINDS, local_store
from tests.vectors.runner import FakeClock

ALL = sorted(ALGORITHMS)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Every test runs on MemoryStore and on SharedMemoryStore: the same semantics."""
    return str(request.param)


def test_max_keys_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_keys"):
        MemoryStore(max_keys=0)


@pytest.mark.parametrize("algorithm", ALL)
def test_several_limits_are_all_or_nothing(algorithm: str, kind: str, clock: FakeClock) -> None:
    store: Any = local_store(kind, clock=clock)
    loose = Limit(Rate(10, 60.0), algorithm, "loose")
    tight = Limit(Rate(2, 60.0), algorithm, "tight")
    keys = ["rw:{a|x}:loose", "rw:{b|x}:tight"]
    assert store.hit_now(keys, [loose, tight], [1, 1]).allowed
    assert store.hit_now(keys, [loose, tight], [1, 1]).allowed
    loose_before = store.state_of(keys[0])
    tight_before = store.state_of(keys[1])
    for _ in range(5):
        denied = store.hit_now(keys, [loose, tight], [1, 1])
        assert not denied.allowed
        assert denied.policy == "tight"  # the deciding (denying) limit is reported
    # Neither limit was charged by the denials: the loose one still has 8 left.
    assert store.state_of(keys[0]) == loose_before
    assert store.state_of(keys[1]) == tight_before
    assert store.peek_now([keys[0]], [loose])[0].remaining == 8
    # A single-limit check of the loose key proves its counter is intact.
    for _ in range(8):
        assert store.hit_now([keys[0]], [loose], [1]).allowed
    assert not store.hit_now([keys[0]], [loose], [1]).allowed


def test_combined_decision_reports_fewest_remaining_when_allowed(kind: str, clock: FakeClock) -> None:
    store: Any = local_store(kind, clock=clock)
    limits = [Limit(Rate(10, 60.0), name="big"), Limit(Rate(3, 60.0), name="small")]
    decision = store.hit_now(["k1", "k2"], limits, [1, 1])
    assert decision.allowed and decision.policy == "small" and decision.remaining == 2


def test_denied_request_changes_no_state(kind: str, clock: FakeClock) -> None:
    for algorithm in ALL:
        store: Any = local_store(kind, clock=clock)
        limit = Limit(Rate(3, 10.0), algorithm)
        while store.hit_now(["k"], [limit], [1]).allowed:
            pass
        before = store.state_of("k")
        assert not store.hit_now(["k"], [limit], [2]).allowed
        assert store.state_of("k") == before, algorithm


def test_peek_charges_nothing(kind: str, clock: FakeClock) -> None:
    store: Any = local_store(kind, clock=clock)
    limit = Limit(Rate(3, 10.0), "sliding_log")
    store.hit_now(["k"], [limit], [1])
    before = store.state_of("k")
    for _ in range(10):
        assert store.peek_now(["k"], [limit])[0].remaining == 2
    assert store.state_of("k") == before
    assert store.peek_now(["unknown"], [limit])[0].remaining == 3
    assert store.state_of("unknown") is None


def test_reset_and_clear(kind: str, clock: FakeClock) -> None:
    store: Any = local_store(kind, clock=clock)
    limit = Limit(Rate(1, 60.0))
    assert store.hit_now(["a"], [limit], [1]).allowed
    assert store.hit_now(["b"], [limit], [1]).allowed
    assert not store.hit_now(["a"], [limit], [1]).allowed
    store.reset_now(["a", "never-seen"])
    assert store.hit_now(["a"], [limit], [1]).allowed
    assert not store.hit_now(["b"], [limit], [1]).allowed
    store.clear_now()
    assert len(store) == 0
    assert store.hit_now(["b"], [limit], [1]).allowed


def test_flood_of_a_hundred_thousand_keys_stays_bounded_and_never_frees_a_limited_key(kind: str, clock: FakeClock) -> None:
    """100 times the store's bound in distinct keys: it stays at its bound, and the key at its limit
    is never freed for room."""
    store: Any = local_store(kind, 1000, clock=clock)
    limit = Limit(Rate(3, 600.0), "fixed_window", "api")
    clock.now = 6000.0  # start of an aligned 10-minute window
    victim = "rw:{api|attacker}:x"
    for _ in range(3):
        assert store.hit_now([victim], [limit], [1.0]).allowed
    assert not store.hit_now([victim], [limit], [1.0]).allowed
    costs = [1.0]
    limits = [limit]
    hit_now = store.hit_now
    biggest = 0
    for i in range(100_000):
        if i % 1_000 == 0:
            clock.now += 1.0  # 100 s of flood, all inside the window: every state stays live
            biggest = max(biggest, len(store))
        hit_now([f"rw:{{api|flood-{i}}}:x"], limits, costs)
    assert max(biggest, len(store)) <= 1000
    assert len(store) == 1000
    # The key that was at its limit is still limited: no live counter was reset.
    denied = store.hit_now([victim], [limit], [1.0])
    assert not denied.allowed
    assert denied.retry_after == pytest.approx(6600.0 - clock.now)
    # Every key beyond the bound shared one overflow allowance, so the flood bought 3 requests, not 99,000.
    assert store.overflowed >= 99_000
    first = store.state_of("rw:{api|flood-0}:x")
    assert first is not None and first[1] == 1.0


def test_expired_entries_are_reclaimed(kind: str, clock: FakeClock) -> None:
    store: Any = local_store(kind, 100, clock=clock)
    limit = Limit(Rate(2, 10.0), "token_bucket")
    for i in range(100):
        store.hit_now([f"old-{i}"], [limit], [1])
    assert len(store) == 100
    before = store.overflowed
    clock.advance(60.0)  # every old state has expired
    for i in range(100):
        decision = store.hit_now([f"new-{i}"], [limit], [1])
        # A fresh key gets its own full allowance: room was reclaimed, not overflowed.
        assert decision.allowed and decision.remaining == 1
    assert store.overflowed == before
    assert len(store) <= 100
    assert all(store.state_of(f"new-{i}") is not None for i in range(100))
    assert all(store.state_of(f"old-{i}") is None for i in range(100))


def test_expired_key_charged_beside_a_new_key_keeps_its_charge(kind: str, clock: FakeClock) -> None:
    """A check of an expired key and a new key: reclaiming room for the new key must not drop the
    expired key's entry the same check just charged (it sits first in line to be swept)."""
    store: Any = local_store(kind, clock=clock)
    short = Limit(Rate(5, 1.0), name="short")
    long = Limit(Rate(5, 600.0), name="long")
    store.hit_now(["expired"], [short], [1])
    clock.advance(2.0)  # "expired" is the oldest entry and has expired
    decision = store.hit_now(["expired", "new"], [short, long], [1, 1])
    assert decision.allowed
    for _ in range(3):
        store.hit_now(["expired"], [short], [1])
    last = store.hit_now(["expired"], [short], [1])
    assert (last.allowed, last.remaining) == (True, 0)  # 5 charged in this window: the fifth fits
    assert not store.hit_now(["expired"], [short], [1]).allowed


def test_reclaiming_happens_without_a_full_table(kind: str, clock: FakeClock) -> None:
    """Expired states are dropped a few at a time as new keys arrive, not only at the bound."""
    store: Any = local_store(kind, 10_000, clock=clock)
    limit = Limit(Rate(1, 1.0), "gcra")
    for i in range(1000):
        store.hit_now([f"a-{i}"], [limit], [1])
    clock.advance(5.0)
    for i in range(1000):
        store.hit_now([f"b-{i}"], [limit], [1])
    assert len(store) <= 1100  # most of the 1000 expired states were swept by the 1000 new keys


class _CountingSweeps(MemoryStore):
    """A memory store counting the entries its sweeps inspect."""

    def __init__(self, max_keys: int, clock: FakeClock) -> None:
        super().__init__(max_keys, clock)
        self.inspected = 0

    def _sweep(self, count: int, now: float) -> None:
        self.inspected += min(count, len(self))
        super()._sweep(count, now)


def test_a_full_table_of_live_keys_is_not_swept_for_every_new_key(clock: FakeClock) -> None:
    """A flood of new keys on a table full of live states used to sweep 64 entries per key (1M
    keys held: 9x slower checks). A sweep that reclaims nothing pauses the next one; expired room
    is still reclaimed once the pause is over."""
    store = _CountingSweeps(1000, clock)
    live = Limit(Rate(5, 600.0), name="live")
    for i in range(1000):
        store.hit_now([f"live-{i}"], [live], [1.0])
    store.inspected = 0
    for i in range(10_000):
        store.hit_now([f"flood-{i}"], [live], [1.0])
    assert store.inspected <= 64  # one sweep found only live states, then new keys overflowed
    assert store.overflowed == 10_000 and len(store) == 1000
    clock.advance(0.05)
    store.hit_now(["after-pause"], [live], [1.0])
    assert 64 <= store.inspected <= 2 * 64  # the pause is over: one more look
    clock.advance(601.0)  # every live state has expired: new keys get their own room again
    overflowed = store.overflowed
    for i in range(100):
        assert store.hit_now([f"fresh-{i}"], [live], [1.0]).remaining == 4
    assert store.overflowed == overflowed


def test_bound_holds_for_multi_limit_checks(kind: str, clock: FakeClock) -> None:
    store: Any = local_store(kind, 50, clock=clock)
    limits = [Limit(Rate(5, 600.0), name="a"), Limit(Rate(50, 600.0), name="b"), Limit(Rate(9, 600.0), name="c")]
    for i in range(1000):
        store.hit_now([f"a{i}", f"b{i}", f"c{i}"], limits, [1, 1, 1])
        assert len(store) <= 50


@pytest.fixture
def fast_switching() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


@pytest.mark.usefixtures("fast_switching")
@pytest.mark.parametrize("algorithm", ALL)
def test_threads_on_one_key_get_exactly_the_limit(algorithm: str, kind: str, clock: FakeClock) -> None:
    limiter = Limiter(local_store(kind, clock=clock))
    allowed = [0] * 8
    barrier = threading.Barrier(8)

    def worker(n: int) -> None:
        barrier.wait()
        for _ in range(250):
            if limiter.hit_sync("shared", "500/hour", algorithm=algorithm).allowed:
                allowed[n] += 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(allowed) == 500


def test_the_store_mutex_keeps_other_threads_out_until_released() -> None:
    """The bound ``_acquire``/``_release`` a check calls are the store's lock: a thread that wants
    it while it is held waits, and gets it once it is released."""
    store = MemoryStore()
    store._acquire()
    assert store._lock.locked()  # the same lock the store's other methods take with ``with``
    entered = threading.Event()

    def other() -> None:
        store._acquire()
        entered.set()
        store._release()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert not entered.wait(0.2)
    finally:
        store._release()
    assert entered.wait(10)
    thread.join()
    store.hit_now(["k"], [Limit(Rate(1, 60.0))], [1])
    assert not store._lock.locked()  # a check leaves it free


# --- the store answers exactly what the pure algorithm answers -------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(ALL),
    st.integers(1, 6),
    st.sampled_from([1.0, 10.0]),
    st.lists(st.tuples(st.sampled_from([0.0, 0.1, 0.7, 3.0, 25.0]), st.integers(0, 7)), max_size=40),
)
# A drained level left a float residue (4.7e-11): the algorithm refused a full-bucket request that the
# store, whose state had just expired, allowed.
@example("leaky_bucket", 5, 1.0, [(0.0, 1), (0.1, 0), (0.1, 5)])
def test_store_matches_the_pure_algorithm(
    kind: str, algorithm: str, limit: int, period: float, hits: list[tuple[float, int]]
) -> None:
    clock = FakeClock(1_000_000.0)
    store: Any = local_store(kind, clock=clock)  # neighbours make the store sweep (and drop expired states)
    lim = Limit(Rate(limit, period), algorithm)
    fn = ALGORITHMS[algorithm]
    state = None
    for dt, cost in hits:
        clock.advance(dt)
        store.hit_now([f"other-{clock.now}"], [lim], [1])  # neighbours come and go
        expected_state, expected = fn(state, clock.now, cost, lim.rate)
        got = store.hit_now(["me"], [lim], [cost])
        assert got == expected, (clock.now, cost)
        if expected_state is not None:
            state = expected_state
