"""Scenario definitions match the reference suites and resolve by key or group."""

from __future__ import annotations

import pytest

from ratewarden.bench.drivers.inprocess import plan
from ratewarden.bench.scenarios import ALGORITHMS, QUICK_LIVE, QUICK_SCENARIOS, SCENARIOS, resolve


def test_reference_tuples() -> None:
    # (limit, window, requests, mode, concurrency) from the old traffik-vs-SlowAPI suite
    expect = {
        "http.low": (100, 60, 50, "sequential", 1),
        "http.high": (100, 60, 200, "sequential", 1),
        "http.sustained": (1000, 60, 500, "batches", 50),
        "http.burst": (50, 60, 100, "sequential", 1),
        "race": (100, 60, 150, "all_at_once", 1),
    }
    for key, tup in expect.items():
        s = SCENARIOS[key]
        assert (s.limit, s.window_s, s.requests, s.mode, s.concurrency) == tup, key
    d = SCENARIOS["distributed"]
    assert (d.clients, d.requests, d.limit, d.expected_allowed) == (10, 120, 100, 1000)
    sel = SCENARIOS["mw.selective"]
    assert (sel.limit, sel.requests, sel.exempt_requests, sel.expected_allowed) == (50, 100, 100, 150)


def test_expected_allowed_is_what_an_exact_limiter_allows() -> None:
    for s in SCENARIOS.values():
        if s.expected_allowed is None or s.tiers or s.identity == "many" or s.mode == "clients":
            continue
        if s.connections > 1:  # one client over several connections shares one bucket
            assert s.expected_allowed == min(s.limit, s.requests * s.connections)
            continue
        assert s.expected_allowed == min(s.limit, s.requests) + s.exempt_requests, s.key


def test_every_algorithm_has_a_strategy_scenario() -> None:
    assert {s.algorithm for s in resolve(["strategy"])} == set(ALGORITHMS)


def test_resolve_by_key_group_prefix_and_all() -> None:
    assert [s.key for s in resolve(["race"])] == ["race"]
    assert {s.key for s in resolve(["middleware"])} >= {"mw.low", "mw.selective"}
    assert all(s.key.startswith("ws.") for s in resolve(["ws"]))
    assert len(resolve(["all"])) == len(SCENARIOS)
    assert {s.key for s in resolve(list(QUICK_SCENARIOS + QUICK_LIVE))} == set(QUICK_SCENARIOS + QUICK_LIVE)
    with pytest.raises(KeyError, match="nope"):
        resolve(["race", "nope"])


def test_plans_send_the_declared_requests_with_the_declared_identities() -> None:
    d = plan(SCENARIOS["distributed"])
    assert len(d) == 10 and all(len(seq) == 120 for seq in d)
    assert len({seq[0].headers for seq in d}) == 10  # one identity per client
    sel = plan(SCENARIOS["mw.selective"])[0]
    assert [r.path for r in sel].count("/unthrottled") == 100
    many = plan(SCENARIOS["keys.many"])[0]
    assert len({r.headers for r in many}) == 1000
    tiers = plan(SCENARIOS["tiered"])[0]
    assert {r.group for r in tiers} == {"premium", "standard", "basic"} and len(tiers) == 120
