"""Runs the scenario x store x library x concurrency matrix: warm-up, timed iterations, median selection.

Multi-worker scenarios run a fixed set of (library, store) configurations instead (:data:`WORKER_CONFIGS`):
each library's way of running several processes on one host.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import rlflx
from .adapters import Adapter, StoreSpec, Unsupported, load
from .drivers import inprocess, live
from .results import BASELINES, Row, Run, baseline_of, median_run, spread
from .scenarios import Scenario
from .services import StoreService

__all__ = ["FLOOD_STORES", "WORKER_CONFIGS", "WORKER_STORES", "Options", "Result", "Task", "admit_limit",
           "live_expected", "plan_tasks", "run_all"]

# (library, store) rows of a multi-worker scenario: ratewarden with a per-process, a shared-memory and a
# Redis store; the peers with their one-host options (slowapi: per-process memory; traffik: its
# experimental multiprocess backend); no limiter.
WORKER_CONFIGS = (
    ("ratewarden", "memory"), ("ratewarden", "shm"), ("ratewarden", "redis"),
    ("traffik", "shm"), ("slowapi", "memory"), ("bare", "none"),
)
WORKER_STORES = ("memory", "shm", "redis")
# The flood scenarios' stores when --store is not given: the shared ones first (where a limiter
# that is not exact admits too many), memory for reference.
FLOOD_STORES = ("redis", "memcached", "memory")

_LOGGERS = ("ratewarden", "traffik", "slowapi", "limits", "asyncio")


@dataclass
class Options:
    """Everything a run needs (the CLI fills this in)."""

    scenarios: list[Scenario]
    libraries: list[str]
    stores: list[str] = field(default_factory=lambda: ["memory"])
    iterations: int = 3
    warmup: int = 1
    concurrency: list[int] | None = None
    duration: float = 10.0
    warmup_duration: float = 2.0
    redis_url: str = ""
    memcached_url: str = ""
    redis_cluster_url: str = ""
    workers: int = 0  # uvicorn workers of multi-worker scenarios; 0 = one per core, at least 2
    worker_stores: list[str] = field(default_factory=lambda: list(WORKER_STORES))
    flood_stores: list[str] | None = None  # stores of the flood scenarios (None: ``stores``)
    flood_duration: float = 3.0  # seconds per timed flood iteration


@dataclass(frozen=True)
class Task:
    """One configuration to measure."""

    scenario: Scenario
    library: str
    store: str
    concurrency: int
    workers: int = 1

    @property
    def label(self) -> str:
        w = f" · {self.workers} workers" if self.workers > 1 else ""
        return f"{self.library} · {self.scenario.key} · {self.store} · c={self.concurrency}{w}"


@dataclass
class Result:
    """A measured (or skipped) task: its summary row and every timed iteration."""

    task: Task
    row: Row | None
    runs: list[Run]
    skipped: str = ""


def _levels(sc: Scenario, opts: Options) -> list[int]:
    if opts.concurrency and sc.mode in ("batches", "live"):
        return opts.concurrency
    return [sc.concurrency]


def plan_tasks(opts: Options) -> list[Task]:
    """The ordered task list; the bare baseline runs once per scenario (it has no store) and first."""
    tasks: list[Task] = []
    single = [sc for sc in opts.scenarios if sc.workers == 1]
    for sc in opts.scenarios:
        if sc.workers == 1:
            continue
        workers = opts.workers or sc.workers or live.default_workers()
        for conc in _levels(sc, opts):
            for lib, store in WORKER_CONFIGS:
                if lib in opts.libraries and (store in opts.worker_stores or store == "none"):
                    tasks.append(Task(sc, lib, store, conc, workers))
    flood = [sc for sc in single if sc.group == "flood"]
    plain = [sc for sc in single if sc.group != "flood"]
    for stores, scenarios in ((opts.stores, plain), (opts.flood_stores or opts.stores, flood)):
        for store in stores:
            for sc in scenarios:
                for conc in _levels(sc, opts):
                    for lib in opts.libraries:
                        if lib in BASELINES:
                            if store != stores[0]:
                                continue
                            tasks.append(Task(sc, lib, "none", conc))
                        else:
                            tasks.append(Task(sc, lib, store, conc))
    return tasks


def _row(task: Task, runs: list[Run], driver: str) -> Row:
    sc = task.scenario
    m = median_run(runs)
    lat = m.latency_ms
    n = m.requests or 1
    bare = task.library in BASELINES
    expected = sc.expected_allowed if driver == "inprocess" and not bare else None
    if bare and driver == "inprocess":
        expected = sc.total_requests
    if task.workers > 1 and not bare:
        expected = sc.limit  # a fresh hot key per iteration, a run far shorter than the window
    elif driver == "live":
        expected = live_expected(task, m)
    calls = [r.store_calls for r in runs if r.store_calls is not None]
    admitted = [_admitted(r) for r in runs]
    limit = admit_limit(task, driver)
    worst = max(admitted)
    got = _admitted(m) if driver == "live" and task.workers == 1 else m.allowed
    rounds = spread([r.rps for r in runs])
    return Row(
        library=task.library, scenario=sc.key, group=sc.group, title=sc.title, store=task.store, driver=driver,
        concurrency=task.concurrency, requests=m.requests, rps=m.rps, allowed=m.allowed, throttled=m.throttled,
        errors=m.errors, success_pct=100.0 * m.allowed / n, throttled_pct=100.0 * m.throttled / n,
        lat_mean_ms=lat["mean"], p50_ms=lat["p50"], p95_ms=lat["p95"], p99_ms=lat["p99"], p999_ms=lat["p999"],
        expected_allowed=expected, correct=None if expected is None else got == expected,
        iterations=len(runs), rps_runs=[r.rps for r in runs], algorithm=sc.algorithm,
        cpu_pct=m.cpu_pct, rss_mb=m.rss_mb,
        calls_per_request=(sum(calls) / sum(r.requests for r in runs)) if calls else None,
        groups=m.groups, workers=task.workers,
        admitted=_admitted(m), admitted_max=worst, limit=limit, over_limit=limit is not None and worst > limit,
        admitted_source="handler" if m.admitted is not None else "2xx",
        without_store={k: v for k, v in m.without_store.items() if v},
        measure=sc.measures, rps_min=rounds.min if rounds else None, rps_max=rounds.max if rounds else None,
        rps_cv_pct=rounds.cv_pct if rounds else None,
    )


def live_expected(task: Task, run: Run) -> int | None:
    """What an exact limiter admits in a one-worker live ``run``: its limit, or every request when
    fewer came, for one key (a hot key, or the one client IP of a flood); None where the count
    depends on how wrk spread the keys (many keys) or on the algorithm's parameters, and without a
    limiter. A 429 in an all-allowed run, or a count under the limit, is as inexact as one over it."""
    sc = task.scenario
    if task.library in BASELINES or sc.identity == "many" or sc.algorithm != "fixed_window":
        return None
    return min(sc.limit, _admitted(run) + run.throttled)


def _admitted(run: Run) -> int:
    """The server's own count of handler runs when it gave one, else the 2xx responses."""
    return run.admitted if run.admitted is not None else run.allowed


def admit_limit(task: Task, driver: str) -> int | None:
    """The most an exact limiter may admit in one iteration of ``task`` (None: no limiter, or not known).

    In-process, what the scenario expects. Live, every run starts from a clean store and stays
    inside one window (the runner waits past a window edge), so a fixed window admits at most
    ``limit`` per key: one hot key (a fresh one per iteration with several workers), or at most
    10,000 keys times ``limit`` for the many-keys scenario (a ceiling, not what it should admit).
    """
    sc = task.scenario
    if task.library in BASELINES:
        return None
    if driver == "inprocess":
        return sc.expected_allowed
    if sc.algorithm != "fixed_window":
        return None
    return sc.limit * (live.MANY_KEYS if sc.identity == "many" else 1)


async def _inprocess(
    tasks: list[Task], opts: Options, services: dict[str, StoreService]
) -> list[list[Run] | Exception]:
    """Run the in-process tasks of one scenario and concurrency level interleaved: every library's
    first iteration, then every library's second, and so on, starting each round with the next
    library. An iteration of a low-load scenario lasts a few milliseconds, so a burst of load from
    elsewhere on a shared machine would otherwise land on whichever library ran at that moment.
    Each task's runs, or what stopped it (an adapter that cannot run it, a failure)."""
    adapters: list[Adapter | None] = []
    apps: list[Any] = []
    outcome: list[list[Run] | Exception] = []
    for task in tasks:
        store = services.get(task.store)
        spec = store.spec if store else StoreSpec()
        try:
            adapter: Adapter = load(task.library)(task.scenario, spec)
            app = adapter.build()
            await adapter.start()
        except Exception as exc:
            adapters.append(None)
            apps.append(None)
            outcome.append(exc)
            continue
        adapters.append(adapter)
        apps.append(app)
        outcome.append([])
    try:
        for i in range(opts.warmup + opts.iterations):
            for n in [(i + k) % len(tasks) for k in range(len(tasks))]:
                active, runs = adapters[n], outcome[n]
                if active is None or isinstance(runs, Exception):
                    continue
                try:
                    run = await _iteration(active, apps[n], tasks[n], services.get(tasks[n].store))
                except Exception as exc:
                    outcome[n] = exc
                    continue
                if i >= opts.warmup:
                    runs.append(run)
    finally:
        for started in adapters:
            if started is not None:
                await started.stop()
    return outcome


async def _iteration(adapter: Adapter, app: Any, task: Task, store: StoreService | None) -> Run:
    if store:
        store.flush()
    await adapter.reset()
    before = store.commands() if store else None
    gc.collect()
    gc.disable()  # a collection inside a 30 ms iteration would dominate it
    try:
        run = await inprocess.run_iteration(app, task.scenario, task.concurrency)
    finally:
        gc.enable()
    if before is not None and store:
        after = store.commands()
        run.store_calls = None if after is None else after - before
    return run


def _clear_of_window_edge(window_s: float, duration: float) -> None:
    """Wait for the next window when the run would cross an epoch-aligned window boundary (a fixed
    window restarts there and an exact limiter would rightly allow a second ``limit``)."""
    left = window_s - time.time() % window_s
    if left < duration + 2.0:
        time.sleep(left + 0.05)


def _live_group(tasks: list[Task], opts: Options, services: dict[str, StoreService]) -> list[list[Run] | Exception]:
    """Run the live tasks of one scenario and concurrency level in interleaved rounds: every
    library's server is started first, then each round runs every library once (each round starting
    one further on, :func:`live.rounds`), so a burst of load from elsewhere on a shared machine
    spreads over the libraries instead of landing on one row. Each task's runs, or what stopped it."""
    live.require_wrk()
    outcome: list[list[Run] | Exception] = []
    servers: list[live.LiveServer | None] = []
    with contextlib.ExitStack() as stack:
        for task in tasks:
            store = services.get(task.store)
            multi = task.workers > 1
            server_cores = None if multi else live.cpu_plan()[0]
            try:
                server = rlflx.server_class(task.library)(task.library, task.scenario,
                                                          store.spec if store else StoreSpec(), server_cores,
                                                          task.workers)
                servers.append(stack.enter_context(server))
                outcome.append([])
            except Exception as exc:
                _fatal(task, exc)
                servers.append(None)
                outcome.append(exc)
        for i, n in live.rounds(len(tasks), opts.warmup + opts.iterations):
            active, runs = servers[n], outcome[n]
            if active is None or isinstance(runs, Exception):
                continue
            try:
                run = _live_iteration(active, tasks[n], opts, services.get(tasks[n].store), i < opts.warmup)
            except Exception as exc:
                _fatal(tasks[n], exc)
                outcome[n] = exc
                continue
            if i >= opts.warmup:
                runs.append(run)
    return outcome


def _fatal(task: Task, exc: Exception) -> None:
    """Re-raise what stops the whole run (no wrk, a one-worker server that cannot start); anything
    else (Unsupported among them) only skips the row, saying why."""
    if isinstance(exc, live.ServerStartError):
        if task.workers == 1:
            raise exc
        return
    if isinstance(exc, live.LiveError):
        raise exc


def _live_iteration(server: live.LiveServer, task: Task, opts: Options, store: StoreService | None,
                    warm: bool) -> Run:
    """One wrk run of ``task`` on its started ``server``, its admitted count taken from the server."""
    if store:
        store.flush()
    timed = opts.flood_duration if task.scenario.group == "flood" else opts.duration
    duration = opts.warmup_duration if warm else timed
    if task.workers > 1:
        # A reset reaches one worker only: each iteration uses a key no worker has seen instead.
        hot_key = f"hot-key-{time.time_ns()}"
    else:
        hot_key = "hot-key-user"
        server.reset()
    if not warm and task.library not in BASELINES and task.scenario.measures != "allowed":
        _clear_of_window_edge(task.scenario.window_s, duration)
    before = store.commands() if store else None
    counted = server.stats()
    client_cores = None if task.workers > 1 else live.cpu_plan()[1]
    run = live.run_iteration(server, task.scenario, duration, task.concurrency, client_cores, hot_key)
    live.count_admitted(run, counted, server.settled_stats())
    if before is not None and store:
        after = store.commands()
        run.store_calls = None if after is None else after - before
    return run


def run_all(opts: Options, on_start: Callable[[Task], None] | None = None,
            on_done: Callable[[Result], None] | None = None) -> list[Result]:
    """Measure every task; a library that cannot run a task yields a skipped result, not a failure."""
    results: list[Result] = []
    services: dict[str, StoreService] = {}
    # Store errors under load show up in the rows (allowed counts, errors); per-request log lines
    # from the libraries would only bury the progress bar.
    quiet = {name: logging.getLogger(name).level for name in _LOGGERS}
    for name in quiet:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        live_tasks = [t for t in plan_tasks(opts) if t.scenario.mode == "live"]
        if live_tasks:
            # Before any server starts: children (redis-server, uvicorn, wrk) inherit the limit.
            live.raise_fd_limit(max(t.concurrency for t in live_tasks) * 2 + 1024)
        urls = {"redis": opts.redis_url, "redis-cluster": opts.redis_cluster_url, "memcached": opts.memcached_url}
        for kind in dict.fromkeys(t.store for t in plan_tasks(opts)):
            if kind not in ("memory", "none"):
                services[kind] = StoreService(kind, urls.get(kind, ""))
                services[kind].start()
        for group in _groups(plan_tasks(opts)):
            for task in group:
                if on_start:
                    on_start(task)
            if group[0].scenario.mode == "live":
                outcomes = _live_group(group, opts, services)
            else:
                outcomes = list(asyncio.run(_inprocess(group, opts, services)))
            for task, outcome in zip(group, outcomes, strict=True):
                result = _result(task, outcome, "live" if task.scenario.mode == "live" else "inprocess")
                results.append(result)
                if on_done:
                    on_done(result)
    finally:
        for service in services.values():
            service.stop()
        for name, level in quiet.items():
            logging.getLogger(name).setLevel(level)
    _add_ratios([r.row for r in results if r.row])
    return results


def _groups(tasks: list[Task]) -> list[list[Task]]:
    """Consecutive tasks of one scenario and concurrency level (its libraries), run interleaved:
    in-process ones in one event loop, live ones (one worker) on one store as rounds over their
    servers, the bare baseline joining the group before it. A multi-worker task stays alone."""
    groups: list[list[Task]] = []
    for task in tasks:
        last = groups[-1] if groups else None
        if last is not None and _joins(last, task):
            last.append(task)
        else:
            groups.append([task])
    return groups


def _joins(group: list[Task], task: Task) -> bool:
    first = group[0]
    if first.scenario.key != task.scenario.key or first.concurrency != task.concurrency:
        return False
    if (first.scenario.mode == "live") != (task.scenario.mode == "live"):
        return False
    if first.scenario.mode != "live":
        return True
    if first.workers > 1 or task.workers > 1:
        return False
    stores = {t.store for t in group if t.library not in BASELINES}
    return task.library in BASELINES or not stores or task.store in stores


def _result(task: Task, outcome: list[Run] | Exception, driver: str) -> Result:
    if isinstance(outcome, Unsupported):
        return Result(task, None, [], skipped=str(outcome))
    if isinstance(outcome, live.ServerStartError):
        return Result(task, None, [], skipped=f"did not start: {outcome}")
    if isinstance(outcome, Exception):
        return Result(task, None, [], skipped=f"failed: {type(outcome).__name__}: {outcome}")
    return Result(task, _row(task, outcome, driver), outcome)


def _add_ratios(rows: list[Row]) -> None:
    """Each row's ratio to the bare app of its scenario and framework (``baseline_of``): of the
    medians, and the lowest and highest of the round-by-round ratios (round i of both rows ran
    close together: they are interleaved)."""
    bare = {(r.library, r.scenario, r.driver, r.concurrency): r for r in rows if r.library in BASELINES}
    for r in rows:
        base = bare.get((baseline_of(r.library), r.scenario, r.driver, r.concurrency))
        if base and base.rps:
            r.vs_bare = r.rps / base.rps
            paired = [a / b for a, b in zip(r.rps_runs, base.rps_runs, strict=False) if b]
            if r.library not in BASELINES and len(paired) == len(r.rps_runs) == len(base.rps_runs) and paired:
                r.vs_bare_min, r.vs_bare_max = min(paired), max(paired)
