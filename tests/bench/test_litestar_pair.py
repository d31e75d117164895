"""The Litestar pair of the bench: bare Litestar, Litestar's own RateLimitConfig and ratewarden.litestar
on the same Litestar app, each limiter exact on the scenarios it runs, and its ``x bare`` taken
against bare Litestar (never the FastAPI bare app)."""

from __future__ import annotations

import pytest

from ratewarden.bench.adapters import LIBRARIES, OPT_IN, StoreSpec, Unsupported, load
from ratewarden.bench.drivers.inprocess import run_iteration
from ratewarden.bench.results import Run
from ratewarden.bench.runner import Options, Task, _add_ratios, _row, plan_tasks
from ratewarden.bench.scenarios import SCENARIOS
from ratewarden.bench.services import StoreService

PAIR = ("litestar", "ratewarden-litestar")


async def measure(library: str, key: str, store: StoreSpec | None = None) -> tuple[int, int, int | None]:
    """One iteration from a clean store: (allowed, throttled, the handlers' own count of runs)."""
    adapter = load(library)(SCENARIOS[key], store or StoreSpec())
    app = adapter.build()
    await adapter.start()
    try:
        if store is not None and store.kind != "memory":
            await run_iteration(app, SCENARIOS[key])  # a discarded warm-up: connections, scripts
        await adapter.reset()
        runs = app.state.bench_handler_runs  # type: ignore[attr-defined]
        before = runs.n
        run = await run_iteration(app, SCENARIOS[key])
    finally:
        await adapter.stop()
    assert run.errors == 0, run.status
    return run.allowed, run.throttled, runs.n - before


def test_the_pair_is_asked_for_by_name_only() -> None:
    assert {"litestar-bare", *PAIR} <= set(LIBRARIES)
    assert {"litestar-bare", *PAIR} <= OPT_IN


@pytest.mark.parametrize("library", PAIR)
@pytest.mark.parametrize("key", ["http.high", "mw.high", "mw.selective", "race", "distributed", "keys.hot"])
async def test_each_limiter_admits_exactly_the_limit(library: str, key: str) -> None:
    sc = SCENARIOS[key]
    allowed, throttled, ran = await measure(library, key)
    assert (allowed, ran) == (sc.expected_allowed, sc.expected_allowed - sc.exempt_requests)  # /unthrottled: not counted
    assert allowed + throttled == sc.total_requests


async def test_bare_litestar_never_throttles() -> None:
    assert await measure("litestar-bare", "race") == (150, 0, 150)


@pytest.mark.parametrize("library", PAIR)
async def test_each_limiter_is_exact_on_redis(library: str) -> None:
    with StoreService("redis") as service:
        assert await measure(library, "race", service.spec) == (100, 50, 100)


def test_what_the_pair_cannot_run_says_why() -> None:
    with pytest.raises(Unsupported, match="algorithm"):
        load("litestar")(SCENARIOS["strategy.gcra"], StoreSpec()).build()
    with pytest.raises(Unsupported, match="memcached"):
        load("litestar")(SCENARIOS["http.high"], StoreSpec("memcached", "memcached://127.0.0.1:1")).build()
    for library in ("litestar-bare", *PAIR):
        with pytest.raises(Unsupported, match="WebSocket"):
            load(library)(SCENARIOS["ws.low"], StoreSpec()).build()


def _run(rps: float, limited: bool) -> Run:
    """An iteration of http.high (200 requests; a limiter admits 100) at ``rps``."""
    return Run(requests=200, duration_s=200 / rps, status={"200": 100, "429": 100} if limited else {"200": 200},
               latency_ms={"mean": 1.0, "p50": 1.0, "p95": 1.0, "p99": 1.0, "p999": 1.0})


def test_the_pair_is_measured_against_bare_litestar() -> None:
    """Bare Litestar runs once per scenario, beside the pair, as bare FastAPI does; each row's
    ``x bare`` is against the bare app of its own framework, round by round."""
    sc = SCENARIOS["http.high"]
    opts = Options(scenarios=[sc], libraries=["ratewarden", "bare", "litestar-bare", *PAIR], stores=["memory", "redis"])
    tasks = plan_tasks(opts)
    assert [(t.library, t.store) for t in tasks if t.library.endswith("bare")] == [("bare", "none"),
                                                                                   ("litestar-bare", "none")]
    rps = {"bare": (10_000, 10_000, 10_000), "litestar-bare": (8_000, 6_000, 7_000),
           "litestar": (2_000, 1_500, 1_750), "ratewarden-litestar": (7_200, 5_700, 6_300),
           "ratewarden": (9_000, 9_500, 9_250)}
    rows = [_row(Task(sc, lib, "none" if lib.endswith("bare") else "memory", 1),
                 [_run(r, not lib.endswith("bare")) for r in rounds], "inprocess") for lib, rounds in rps.items()]
    _add_ratios(rows)
    ratio = {r.library: (r.vs_bare, r.vs_bare_min, r.vs_bare_max) for r in rows}
    assert ratio["ratewarden"] == pytest.approx((0.925, 0.9, 0.95))
    assert ratio["litestar"] == pytest.approx((0.25, 0.25, 0.25))
    assert ratio["ratewarden-litestar"] == pytest.approx((0.9, 0.9, 0.95))
    assert ratio["litestar-bare"] == (1.0, None, None)
    cells = {r.library: r.exact_cell for r in rows}
    assert cells["litestar-bare"] == "—" and cells["litestar"] == "yes"  # a baseline limits nothing
