"""Property tests of the seven pure algorithms (hypothesis), plus targeted checks.

Each property replays a random sequence of (time step, cost) hits through one algorithm, keeps
what it admitted, and checks the promise that algorithm makes over *every* window or interval,
recomputed independently from the admitted hits.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ratewarden.algorithms import ALGORITHMS
from ratewarden.decision import Decision
from ratewarden.rates import Rate

EPS = 1e-6
START = 1_000_000.0  # a realistic epoch-ish offset, so float rounding at large times is exercised

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

rates = st.builds(
    Rate,
    limit=st.integers(1, 12),
    period=st.sampled_from([0.5, 1.0, 2.0, 10.0, 60.0]),
)
steps = st.lists(
    st.tuples(
        st.one_of(st.just(0.0), st.floats(0.0, 3.0, allow_nan=False), st.sampled_from([0.25, 0.5, 1.0, 10.0])),
        st.integers(1, 14),
    ),
    min_size=1,
    max_size=80,
)


def replay(
    algorithm: str, rate: Rate, hits: list[tuple[float, int]]
) -> Iterator[tuple[float, int, tuple[float, ...] | None, Decision, tuple[float, ...] | None]]:
    """Yield (now, cost, state before, decision, state after) for each hit."""
    fn = ALGORITHMS[algorithm]
    state: tuple[float, ...] | None = None
    now = START
    for dt, cost in hits:
        now += dt
        new_state, decision = fn(state, now, cost, rate)
        yield now, cost, state, decision, new_state
        if new_state is not None:
            state = new_state


def admitted(algorithm: str, rate: Rate, hits: list[tuple[float, int]]) -> list[tuple[float, int]]:
    return [(now, cost) for now, cost, _, d, _ in replay(algorithm, rate, hits) if d.allowed]


def _aligned_totals(rate: Rate, events: list[tuple[float, int]]) -> dict[float, int]:
    totals: dict[float, int] = {}
    for now, cost in events:
        start = math.floor(now / rate.period) * rate.period
        totals[start] = totals.get(start, 0) + cost
    return totals


# --- per-algorithm window promises ---------------------------------------------------------


@PROPS
@given(rates, steps)
def test_fixed_window_never_exceeds_limit_per_aligned_window(rate: Rate, hits: list[tuple[float, int]]) -> None:
    events = admitted("fixed_window", rate, hits)
    assert all(total <= rate.limit for total in _aligned_totals(rate, events).values())


@PROPS
@given(rates, steps)
def test_sliding_log_never_exceeds_limit_in_any_sliding_window(rate: Rate, hits: list[tuple[float, int]]) -> None:
    events = admitted("sliding_log", rate, hits)
    # The busiest window of length `period` ends at an admitted hit: check every one.
    for end, _ in events:
        inside = sum(cost for t, cost in events if end - rate.period < t <= end)
        assert inside <= rate.limit


@PROPS
@given(rates, steps)
def test_sliding_window_counter_promises(rate: Rate, hits: list[tuple[float, int]]) -> None:
    events = admitted("sliding_window", rate, hits)
    totals = _aligned_totals(rate, events)
    assert all(total <= rate.limit for total in totals.values())
    # The weighted estimate (previous window weighted by its overlap, plus the current window up
    # to and including this hit) never exceeds the limit after an admitted hit.
    for i, (now, _) in enumerate(events):
        start = math.floor(now / rate.period) * rate.period
        current = sum(c for t, c in events[: i + 1] if math.floor(t / rate.period) * rate.period == start)
        previous = totals.get(start - rate.period, 0)
        weight = 1.0 - (now - start) / rate.period
        assert previous * weight + current <= rate.limit + EPS


def _max_in_intervals(events: list[tuple[float, int]]) -> Iterator[tuple[float, int]]:
    """(length, total cost) of every interval starting and ending at admitted hits."""
    for i, (a, _) in enumerate(events):
        total = 0
        for b, cost in events[i:]:
            total += cost
            yield b - a, total


@PROPS
@given(rates, st.integers(1, 15), steps)
@pytest.mark.parametrize("algorithm", ["token_bucket", "leaky_bucket", "gcra"])
def test_bucket_algorithms_admit_at_most_burst_plus_rate_times_interval(
    algorithm: str, rate: Rate, burst: int, hits: list[tuple[float, int]]
) -> None:
    for with_burst in (Rate(rate.limit, rate.period), Rate(rate.limit, rate.period, burst)):
        per_second = with_burst.limit / with_burst.period
        events = admitted(algorithm, with_burst, hits)
        for length, total in _max_in_intervals(events):
            assert total <= with_burst.capacity + per_second * length + EPS


@PROPS
@given(rates, st.integers(1, 15), st.integers(0, 10), steps)
def test_token_bucket_debt_admits_at_most_burst_plus_debt_plus_rate_times_interval(
    rate: Rate, burst: int, debt: int, hits: list[tuple[float, int]]
) -> None:
    with_debt = Rate(rate.limit, rate.period, burst, float(debt))
    per_second = with_debt.limit / with_debt.period
    events = admitted("token_bucket_debt", with_debt, hits)
    for length, total in _max_in_intervals(events):
        assert total <= with_debt.capacity + debt + per_second * length + EPS
    # The overdraft must be repaid before the next allow: after an admitted hit that left the
    # balance negative, nothing is admitted until the refill has brought it back above zero.
    charged = [(now, after) for now, _, _, d, after in replay("token_bucket_debt", with_debt, hits) if d.allowed]
    for (t1, after), (t2, _) in itertools.pairwise(charged):
        assert after is not None
        if after[0] < 0:
            assert t2 - t1 >= -after[0] / per_second - EPS


# --- properties every algorithm shares --------------------------------------------------------

ALL = sorted(ALGORITHMS)


@PROPS
@given(rates, steps)
@pytest.mark.parametrize("algorithm", ALL)
def test_decisions_are_consistent(algorithm: str, rate: Rate, hits: list[tuple[float, int]]) -> None:
    for _, cost, _, decision, new_state in replay(algorithm, rate, hits):
        # A denied request changes nothing: the algorithm returns no new state.
        assert (new_state is None) == (not decision.allowed)
        assert decision.remaining >= 0
        assert decision.remaining <= decision.limit
        assert decision.reset_after >= -EPS
        if decision.allowed:
            assert decision.retry_after == 0.0
            # The state lives for reset_after seconds, so it must be positive after a charge.
            assert decision.reset_after > 0
        else:
            assert decision.retry_after > 0
            if cost > (rate.capacity if algorithm in ("token_bucket", "leaky_bucket", "gcra") else rate.limit) and (
                algorithm != "token_bucket_debt"
            ):
                assert math.isinf(decision.retry_after)


@PROPS
@given(rates, steps)
@pytest.mark.parametrize("algorithm", ALL)
def test_retry_after_is_exact(algorithm: str, rate: Rate, hits: list[tuple[float, int]]) -> None:
    """A denied request repeated at now + retry_after is allowed; noticeably earlier it is denied."""
    fn = ALGORITHMS[algorithm]
    for now, cost, state, decision, _ in replay(algorithm, rate, hits):
        if decision.allowed or math.isinf(decision.retry_after):
            continue
        retry = decision.retry_after
        _, later = fn(state, now + retry + 1e-7, cost, rate)
        assert later.allowed, (now, cost, state, decision)
        if retry > 1e-3:
            _, earlier = fn(state, now + retry - 1e-3, cost, rate)
            assert not earlier.allowed, (now, cost, state, decision)


@PROPS
@given(rates, steps)
@pytest.mark.parametrize("algorithm", ALL)
def test_state_expires_after_reset_after(algorithm: str, rate: Rate, hits: list[tuple[float, int]]) -> None:
    """Stores drop a state after reset_after seconds, so by then it must equal "no state"."""
    fn = ALGORITHMS[algorithm]
    state: tuple[float, ...] | None = None
    expires = -math.inf
    for now, _, _, decision, new_state in replay(algorithm, rate, hits):
        if new_state is not None:
            state = new_state
            expires = now + decision.reset_after
    if state is None:
        return
    probe = expires + 1e-6
    _, with_state = fn(state, probe, 1, rate)
    _, fresh = fn(None, probe, 1, rate)
    assert with_state.allowed == fresh.allowed
    assert with_state.remaining == fresh.remaining


@PROPS
@given(rates, steps)
@pytest.mark.parametrize("algorithm", [a for a in ALL if a != "token_bucket_debt"])
def test_zero_cost_peek_reports_at_least_what_a_hit_leaves(
    algorithm: str, rate: Rate, hits: list[tuple[float, int]]
) -> None:
    """A zero-cost request is always allowed (except while in debt, which is tested below) and
    reports no less room than the charged request it precedes."""
    fn = ALGORITHMS[algorithm]
    for now, _, state, decision, _ in replay(algorithm, rate, hits):
        _, peek = fn(state, now, 0, rate)
        assert peek.allowed and peek.retry_after == 0.0
        assert peek.remaining >= decision.remaining


# --- targeted checks -----------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALL)
def test_exactly_limit_admitted_at_one_instant(algorithm: str) -> None:
    rate = Rate(7, 10.0)
    events = admitted(algorithm, rate, [(0.0, 1)] * 20)
    assert len(events) == 7


@pytest.mark.parametrize("algorithm", ALL)
@pytest.mark.parametrize("cost", [2, 3, 5])
def test_costs_above_one(algorithm: str, cost: int) -> None:
    rate = Rate(10, 10.0)
    fn = ALGORITHMS[algorithm]
    state = None
    charged = 0
    for _ in range(10):
        new_state, decision = fn(state, START, cost, rate)
        if not decision.allowed:
            break
        charged += cost
        state = new_state
        if algorithm != "token_bucket_debt":
            assert decision.remaining == 10 - charged
    if algorithm == "token_bucket_debt":
        # The overdraft (default: one limit's worth) lets more through once, never beyond it.
        assert 10 <= charged <= 20
    else:
        assert charged == (10 // cost) * cost


def test_token_bucket_refills_fractionally() -> None:
    rate = Rate(1000, 1.0)  # one token per millisecond
    fn = ALGORITHMS["token_bucket"]
    state, _ = fn(None, START, 1000, rate)
    _, denied = fn(state, START + 0.0004, 1, rate)
    assert not denied.allowed
    assert denied.retry_after == pytest.approx(0.0006, abs=1e-9)
    _, allowed = fn(state, START + 0.0010001, 1, rate)
    assert allowed.allowed


def test_token_bucket_debt_lets_an_oversized_request_through_then_repays() -> None:
    rate = Rate(4, 2.0, None, 4.0)  # 2 tokens/s, bucket 4, overdraft 4
    fn = ALGORITHMS["token_bucket_debt"]
    state, big = fn(None, START, 7, rate)
    assert big.allowed and state is not None and state[0] == pytest.approx(-3.0)
    _, next_one = fn(state, START + 1.0, 1, rate)  # balance -1: must repay first
    assert not next_one.allowed
    assert next_one.retry_after == pytest.approx(1.0)
    _, after = fn(state, START + 2.0 + 1e-9, 1, rate)
    assert after.allowed
    _, never = fn(None, START, 9, rate)  # more than bucket + overdraft
    assert not never.allowed and math.isinf(never.retry_after)


def test_gcra_retry_after_is_not_overstated_by_burst() -> None:
    rate = Rate(10, 10.0, 5)  # one per second, burst 5
    fn = ALGORITHMS["gcra"]
    state = None
    for _ in range(5):
        state, decision = fn(state, START, 1, rate)
        assert decision.allowed
    _, denied = fn(state, START, 1, rate)
    assert not denied.allowed
    assert denied.retry_after == pytest.approx(1.0)


def test_fixed_window_is_epoch_aligned_and_retry_after_matches_the_boundary() -> None:
    rate = Rate(2, 60.0)
    fn = ALGORITHMS["fixed_window"]
    now = 6000.0 + 42.5  # 42.5 s into an aligned minute
    state, first = fn(None, now, 2, rate)
    assert first.reset_after == pytest.approx(17.5)
    _, denied = fn(state, now + 1, 1, rate)
    assert denied.retry_after == pytest.approx(16.5)
    _, next_window = fn(state, 6060.0, 1, rate)
    assert next_window.allowed and next_window.remaining == 1


def test_leaky_bucket_meter_drains_at_rate() -> None:
    rate = Rate(2, 1.0, 4)  # drains 2/s, holds 4
    fn = ALGORITHMS["leaky_bucket"]
    state = None
    for _ in range(4):
        state, decision = fn(state, START, 1, rate)
        assert decision.allowed
    _, denied = fn(state, START, 1, rate)
    assert denied.retry_after == pytest.approx(0.5)
    state, allowed = fn(state, START + 0.5, 1, rate)
    assert allowed.allowed and allowed.remaining == 0


# --- GCRA at wall-clock times: exact, whatever the rate and the clock ------------------------------
# The TAT is an absolute time: at ~1.8e9 s floats are 2.4e-7 s apart, and rounding each request's
# TAT to them once let a burst of 7/hour through one short and one of 10000/s five over.

_WALL_CLOCK = st.one_of(
    st.floats(0.0, 2.0**33, allow_nan=False),
    st.floats(1.7e9, 1.9e9),
    st.sampled_from([0.0, 100.0, 1_800_000_000.0, 2.0**31 - 0.5, 2.0**31, 2.0**33 - 1.0]),
)
_PERIODS = st.one_of(st.sampled_from([0.2, 1.0, 60.0, 3600.0, 86400.0]), st.floats(1e-3, 1e6))


def _same_instant(rate: Rate, now: float, cost: float, calls: int) -> list[bool]:
    state = None
    answers = []
    for _ in range(calls):
        new_state, decision = ALGORITHMS["gcra"](state, now, cost, rate)
        answers.append(decision.allowed)
        if decision.allowed:
            state = new_state
        else:
            assert decision.retry_after > 0 and new_state is None
    return answers


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 100_000), _PERIODS, st.one_of(st.none(), st.integers(1, 1500)), _WALL_CLOCK, st.integers(1, 40)
)
def test_gcra_same_instant_burst_admits_exactly_burst_over_cost(
    limit: int, period: float, burst: int | None, now: float, cost: int
) -> None:
    rate = Rate(limit, period, burst if burst is not None or limit <= 1500 else 1500)
    expected = rate.capacity // cost
    answers = _same_instant(rate, now, cost, expected + 3)
    assert answers == [True] * expected + [False] * 3, (rate, now, cost)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 10_000), _PERIODS, st.integers(1, 300), _WALL_CLOCK, st.floats(0.01, 5.0))
@example(limit=693, period=787791.0, burst=66, now=16702189.0, cost=1.1)
def test_gcra_fractional_costs_never_admit_more_than_burst_over_cost(
    limit: int, period: float, burst: int, now: float, cost: float
) -> None:
    """A fractional charge is taken up to whole grid steps: never more than floor(B/c)."""
    rate = Rate(limit, period, burst)
    # Up to float rounding: 60 charges of 1.1 fill a burst of 66 exactly, though 66 / 1.1 gives 59.999...
    most = math.floor(burst / cost * (1 + 1e-12))
    assert sum(_same_instant(rate, now, cost, most + 3)) <= most


@pytest.mark.parametrize(("limit", "period"), [(7, 3600.0), (5000, 1.0), (10_000, 1.0), (100_000, 1.0), (1, 0.2)])
def test_gcra_the_reported_bursts_are_exact(limit: int, period: float) -> None:
    rng = random.Random(limit)
    for now in [0.0, 2.0**31 - 0.25, 2.0**33 - 2.0, *(1_800_000_000 + rng.random() * 1e6 for _ in range(4))]:
        answers = _same_instant(Rate(limit, period), now, 1, limit + 5)
        assert answers == [True] * limit + [False] * 5, now


@PROPS
@given(
    st.integers(1, 100_000),
    st.sampled_from([1.0, 60.0, 3600.0]),
    st.integers(1, 20),
    st.floats(1.1e9, 2.1e9),
    st.lists(st.tuples(st.floats(0.0, 2.5), st.integers(1, 3)), min_size=1, max_size=120),
)
def test_gcra_never_exceeds_the_rate_at_wall_clock_times(
    limit: int, period: float, burst: int, start: float, hits: list[tuple[float, int]]
) -> None:
    """Time steps drawn in emission intervals (so 100000/s is as busy as 1/hour): in every
    interval between admitted hits, at most ``burst + rate * length``, with no slack."""
    rate = Rate(limit, period, burst)
    interval = period / limit
    state = None
    now = start
    events: list[tuple[float, int]] = []
    for step, cost in hits:
        now += step * interval
        new_state, decision = ALGORITHMS["gcra"](state, now, cost, rate)
        if decision.allowed:
            state = new_state
            events.append((now, cost))
    for length, total in _max_in_intervals(events):
        assert total <= burst + length / interval


def test_gcra_reads_a_state_off_the_grid_conservatively() -> None:
    """A state written before the grid (any float TAT) stays valid and is never read as earlier."""
    rate = Rate(10, 1.0)
    now = 1_800_000_000.0
    old = (now + 0.30001,)  # 3 requests' worth ahead and a bit
    state, decision = ALGORITHMS["gcra"](old, now, 1, rate)
    assert decision.allowed and decision.remaining == 5  # 10 - 3.0001 - 1, rounded down
    assert decision.reset_after >= 0.40001
    assert state is not None and state[0] >= old[0] + 0.1
    _, peek = ALGORITHMS["gcra"](old, old[0], 0, rate)
    assert peek.remaining == 10


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_clock_stepped_back_more_than_a_period_counts_from_now(
    algorithm: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 10/min key exhausted while the clock ran an hour ahead passes once the clock is corrected
    (it stayed refused 3,660 s while Retry-After said 60), and the step is logged once."""
    from ratewarden.algorithms import base

    monkeypatch.setattr(base, "_warned_at", [-math.inf])
    fn = ALGORITHMS[algorithm]
    rate = Rate(10, 60.0)
    ahead = START + 3600.0
    state = None
    for _ in range(10):
        state, _ = fn(state, ahead, 1.0, rate)
    _, refused = fn(state, ahead, 1.0, rate)
    assert not refused.allowed
    with caplog.at_level("WARNING", logger="ratewarden.algorithms"):
        _, corrected = fn(state, START, 1.0, rate)
        fn(state, START + 1.0, 1.0, rate)
    assert corrected.allowed and corrected.remaining == 9, corrected
    warnings = [r.getMessage() for r in caplog.records if "stepped back" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "s ahead of the clock (more than its period, 60 s): the clock stepped back" in warnings[0]


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_late_reading_within_a_period_still_counts_in_the_newer_state(algorithm: str) -> None:
    """A reading less than a period older than the state is a late one: state only moves forward."""
    fn = ALGORITHMS[algorithm]
    rate = Rate(3, 10.0)
    state = None
    for _ in range(3):
        state, _ = fn(state, START + 10.0, 1.0, rate)
    _, late = fn(state, START + 10.0 - 9.5, 1.0, rate)
    assert not late.allowed
