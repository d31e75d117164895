"""Live WSGI rows: Flask and Django apps under gunicorn (sync workers, 2 by default) on
loopback, loaded by wrk, the way the live ASGI scenarios run (``drivers.live``, ``runner``).

Two scenarios, one hot key each (``X-Client-ID``, a fresh value every wrk run, so no run finds a
counter an earlier one used up and no reset has to reach every worker):

* ``wsgi.allowed``: a limit never reached (10⁹ per day): every request is served; the cost a limiter
  adds to served traffic.
* ``wsgi.limited``: 100 per day: 100 requests served, then 429s (django-ratelimit: its 403); what an
  exact limiter admits, and what a refusal costs.

Variants: bare Flask and bare Django (the baselines), a WSGI layer answering a fixed 429 (the floor of a
refusal), flask-limiter, ``ratewarden.flask``, ``ratewarden.wsgi.RateLimitMiddleware`` around Flask,
django-ratelimit and ``ratewarden.django``'s middleware. Each phase puts every library on its own store:

* ``memory``: each library's one-host default: ratewarden's ``SharedMemoryStore`` (one table for
  every worker), flask-limiter's ``memory://`` and django-ratelimit's ``LocMemCache``, both **per
  process**: with N workers they admit up to N x the limit, which the admitted / limit column shows;
* ``redis``: one private ``redis-server`` (or ``--redis-url``) for all of them.

Method: every variant's server of a scenario is up at once; each round runs every variant once (the
order rotated, ``drivers.live.rounds``), a warm-up round first; req/s is wrk's; the admitted count is
the server's own (each worker counts its answers by status in a memory-mapped file: ``Counted``), so
answers wrk never read count too. A row gives req/s of its median round and its slowest round (min),
the spread, the ratio to the bare app of its framework (medians, and round by round), and admitted /
limit: the median round's count, flagged ``⚠`` when any round admitted more than the limit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .adapters.base import StoreSpec
from .drivers import live
from .results import Row, Run, median_run, spread
from .runner import _clear_of_window_edge
from .scenarios import Scenario
from .services import BenchError, StoreService
from .wsgi_apps import ALLOW
from .wsgi_live_apps import COUNT_SLOTS, read_counts

__all__ = ["LIMIT", "PHASES", "SCENARIOS", "GunicornServer", "LiveVariant", "add_ratios", "as_dicts", "describe",
           "live_row", "live_table", "over_limit_lines", "run_live", "variants"]

#: The limit of ``wsgi.limited`` (per day: a run of seconds never crosses a window edge).
LIMIT = 100
PHASES = ("memory", "redis")
_ALLOWED = Scenario("wsgi.allowed", "wsgi", "Flask/Django under gunicorn, all allowed (10^9/day, wrk)", ALLOW, 86400,
                    0, "live", identity="header", concurrency=50, measure="allowed")
_LIMITED = Scenario("wsgi.limited", "wsgi", f"Flask/Django under gunicorn, one hot key ({LIMIT}/day, wrk)", LIMIT,
                    86400, 0, "live", identity="header", concurrency=50, measure="rejected")
SCENARIOS = {sc.key: sc for sc in (_ALLOWED, _LIMITED)}

# What each library runs on in each phase (the row's store cell).
_STORES = {
    ("ratewarden", "memory"): ("shm", "SharedMemoryStore"),
    ("flask-limiter", "memory"): ("memory", "memory:// (per process)"),
    ("django-ratelimit", "memory"): ("memory", "LocMemCache (per process)"),
    ("ratewarden", "redis"): ("redis", "RedisStore (check timeout 1 s)"),
    ("flask-limiter", "redis"): ("redis", "redis://"),
    ("django-ratelimit", "redis"): ("redis", "RedisCache"),
}


@dataclass(frozen=True)
class LiveVariant:
    """One row: the app (a name of ``wsgi_live_apps.LIVE_VARIANTS``), its framework and what it is
    (``bare``: the framework's baseline; ``floor``: no limiter, a fixed 429; ``limiter``)."""

    name: str
    framework: str
    kind: str

    @property
    def family(self) -> str:
        return "ratewarden" if self.name.startswith("ratewarden") else self.name

    def store(self, phase: str) -> tuple[str, str]:
        """(the row's store, its description) in ``phase``."""
        if self.kind != "limiter":
            return "none", "-"
        return _STORES[(self.family, phase)]

    def label(self) -> str:
        return {"ratewarden.wsgi": "ratewarden.wsgi middleware",
                "ratewarden.django": "ratewarden.django middleware"}.get(self.name, self.name)


_VARIANTS = (
    LiveVariant("flask bare", "flask", "bare"),
    LiveVariant("floor: fixed 429", "flask", "floor"),
    LiveVariant("flask-limiter", "flask", "limiter"),
    LiveVariant("ratewarden.flask", "flask", "limiter"),
    LiveVariant("ratewarden.wsgi", "flask", "limiter"),
    LiveVariant("django bare", "django", "bare"),
    LiveVariant("django-ratelimit", "django", "limiter"),
    LiveVariant("ratewarden.django", "django", "limiter"),
)


def variants(scenario: Scenario, only: Sequence[str] = ()) -> list[LiveVariant]:
    """The variants of ``scenario`` (the fixed-429 floor only where requests are refused), or those
    named in ``only``."""
    out = [v for v in _VARIANTS if v.kind != "floor" or scenario.measure == "rejected"]
    return [v for v in out if v.name in only] if only else out


# ---------------------------------------------------------------------------------------------- server

def _package_root() -> str:
    import ratewarden

    return str(Path(ratewarden.__file__).resolve().parents[1])


class GunicornServer(live.LiveServer):
    """One variant under ``gunicorn`` (``workers`` sync workers) on a free loopback port; a context
    manager that always stops it. ``stats`` sums the workers' own answer counts (``Counted``)."""

    def __init__(self, variant: LiveVariant, scenario: Scenario, phase: str, store_url: str, *, workers: int = 2,
                 worker_class: str = "sync", threads: int = 1) -> None:
        store, _ = variant.store(phase)
        super().__init__(variant.name, scenario, StoreSpec(store if store != "none" else "memory", store_url), None,
                         workers)
        self.variant, self.phase, self.worker_class, self.threads = variant, phase, worker_class, threads
        self.counts_dir = tempfile.mkdtemp(prefix="rw-bench-wsgi-")

    def launch(self) -> None:
        """Start gunicorn (``ready`` waits for it): every server of a scenario starts at once."""
        self.port = live.free_port()
        mode = "allow" if self.scenario.measure == "allowed" else "limit"
        store = self.store.kind if self.variant.kind == "limiter" else "memory"
        app = f'ratewarden.bench.wsgi_live_apps:gunicorn_app("{self.variant.name}", "{mode}", "{store}")'
        argv = [sys.executable, "-m", "gunicorn", app, "--bind", f"127.0.0.1:{self.port}",
                "--workers", str(self.workers), "--worker-class", self.worker_class, "--threads", str(self.threads),
                "--log-level", "warning", "--graceful-timeout", "2", "--backlog", "2048"]
        env = {**os.environ, "RW_BENCH_RUN": uuid.uuid4().hex[:8], "RW_BENCH_LIMIT": str(self.scenario.limit),
               "RW_BENCH_PER": "day", "RW_BENCH_KEY": "header", "RW_BENCH_STORE_URL": self.store.url,
               "RW_BENCH_COUNTS": self.counts_dir}
        # The workers import the ratewarden this process runs (a wheel's venv, or a source tree on sys.path).
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH", "")) if p)
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self._log, start_new_session=True,
                                     env=env)

    def ready(self, timeout: float = 30.0) -> None:
        """Wait until gunicorn listens and every worker has built its app (its count file exists)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise live.ServerStartError(f"gunicorn ({self.library}) exited at start: {self.error_line()}")
            workers, _ = read_counts(self.counts_dir)
            if workers >= self.workers:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                        return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise live.ServerStartError(f"gunicorn ({self.library}) had {workers} of {self.workers} workers up "
                                            f"within {timeout:.0f} s: {self.stderr_tail()}")
            time.sleep(0.05)

    def start(self) -> None:
        self.launch()
        self.ready()

    def counts(self) -> dict[str, int]:
        """Every worker's answers so far, by status (``COUNT_SLOTS``)."""
        return read_counts(self.counts_dir)[1]

    def settled_counts(self, settle: float = 0.3, timeout: float = 10.0) -> dict[str, int]:
        """``counts`` once they have stopped moving for ``settle`` s (the workers answer what they
        accepted after wrk stopped)."""
        deadline = time.monotonic() + timeout
        last = self.counts()
        while time.monotonic() < deadline:
            time.sleep(settle)
            now = self.counts()
            if now == last:
                return now
            last = now
        return last

    def stats(self, timeout: float = 10.0) -> live.ServerStats | None:
        return live.ServerStats(self.counts()["2xx"], None)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.counts_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- run

@dataclass
class _Slot:
    variant: LiveVariant
    server: GunicornServer | None
    runs: list[Run]
    served: list[dict[str, int]]
    failed: str = ""


def _iteration(slot: _Slot, sc: Scenario, duration: float, concurrency: int, store: StoreService | None,
               timed: bool) -> None:
    server = slot.server
    assert server is not None
    if store is not None:
        store.flush()
    if timed and slot.variant.kind == "limiter" and sc.measure != "allowed":
        _clear_of_window_edge(sc.window_s, duration)
    before = server.settled_counts(settle=0.05, timeout=1.0)
    run = live.run_iteration(server, sc, duration, concurrency, None, f"wsgi-{uuid.uuid4().hex[:12]}")
    after = server.settled_counts()
    delta = {k: after[k] - before[k] for k in COUNT_SLOTS}
    run.admitted = delta["2xx"]
    if timed:
        slot.runs.append(run)
        slot.served.append(delta)


def _scenario(sc: Scenario, phase: str, store: StoreService | None, *, workers: int, duration: float,
              warmup_duration: float, rounds: int, warmup: int, concurrency: int, only: Sequence[str],
              log: Callable[[str], None]) -> list[Row]:
    """Every variant of ``sc`` in ``phase``: servers up at once, then interleaved rounds."""
    url = store.url if store is not None else ""
    slots = [_Slot(v, None, [], []) for v in variants(sc, only)]
    with contextlib.ExitStack() as stack:
        for slot in slots:
            store_kind, _ = slot.variant.store(phase)
            server = GunicornServer(slot.variant, sc, phase, url if store_kind in ("shm", "redis") else "",
                                    workers=workers)
            stack.callback(server.stop)
            slot.server = server
            server.launch()
        for slot in slots:
            try:
                assert slot.server is not None
                slot.server.ready()
            except live.ServerStartError as exc:
                slot.failed, slot.server = f"did not start: {exc}", None
        log(f"  {sc.key} · {phase}: {sum(s.server is not None for s in slots)} servers up, "
            f"{warmup} warm-up + {rounds} rounds of {duration:g} s")
        for i, n in live.rounds(len(slots), warmup + rounds):
            slot = slots[n]
            if slot.server is None or slot.failed:
                continue
            warm = i < warmup
            try:
                _iteration(slot, sc, warmup_duration if warm else duration, concurrency, store, not warm)
            except live.ServerStartError as exc:
                slot.failed = f"failed: {exc}"
            except live.LiveError:  # wrk itself failed: no row can be measured
                raise
            except Exception as exc:  # this server only (it died, its store failed...): the row says why
                slot.failed = f"failed: {type(exc).__name__}: {exc}; server output: {slot.server.error_line()}"
    rows = [live_row(s.variant, sc, phase, s.runs, s.served, workers, concurrency) if s.runs and not s.failed
            else _missing_row(s.variant, sc, phase, workers, concurrency, s.failed or "no timed round")
            for s in slots]
    add_ratios(rows)
    return rows


def run_live(phases: Sequence[str], *, redis_url: str = "", workers: int = 2, duration: float = 3.0,
             warmup_duration: float = 1.0, rounds: int = 3, warmup: int = 1, concurrency: int = 50,
             scenarios: Sequence[str] = ("wsgi.allowed", "wsgi.limited"), only: Sequence[str] = (),
             log: Callable[[str], None] = print) -> list[Row]:
    """The live rows of ``scenarios`` in each of ``phases`` (``memory``: ratewarden on a fresh
    ``SharedMemoryStore``, the peers per process; ``redis``: a private ``redis-server`` unless
    ``redis_url``). ``only`` keeps the variants it names. Raises ``BenchError`` (no Redis) or
    ``drivers.live.LiveError`` (no wrk)."""
    live.require_wrk()
    if not _has_gunicorn():
        raise BenchError("gunicorn is not installed: pip install 'ratewarden[bench]'")
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        raise BenchError(f"live WSGI rows run on {' and '.join(PHASES)}, got {', '.join(unknown)}")
    rows: list[Row] = []
    for phase in phases:
        with StoreService("shm" if phase == "memory" else "redis", redis_url if phase == "redis" else "") as store:
            for key in scenarios:
                rows += _scenario(SCENARIOS[key], phase, store, workers=workers, duration=duration,
                                  warmup_duration=warmup_duration, rounds=rounds, warmup=warmup,
                                  concurrency=concurrency, only=only, log=log)
    return rows


def _has_gunicorn() -> bool:
    import importlib.util

    return importlib.util.find_spec("gunicorn") is not None


# ---------------------------------------------------------------------------------------------- rows

def live_row(variant: LiveVariant, sc: Scenario, phase: str, runs: Sequence[Run], served: Sequence[dict[str, int]],
             workers: int, concurrency: int) -> Row:
    """The summary of ``runs`` (timed rounds) with the server's answer counts ``served`` (one per run).

    Admitted is the server's 2xx count; a limiter's limit is the scenario's per run (one fresh key
    per run, a run far shorter than the day's window), and it is exact when every run admitted
    ``min(limit, answers)``; over the limit when any run admitted more."""
    m = median_run(runs)
    index = list(runs).index(m)
    admitted = [r.admitted if r.admitted is not None else r.allowed for r in runs]
    limit = sc.limit if variant.kind == "limiter" else None
    exact = [a == min(sc.limit, sum(s.values())) for a, s in zip(admitted, served, strict=True)]
    refused = served[index]["429"] + served[index]["403"]
    lat = m.latency_ms
    n = m.requests or 1
    rounds = spread([r.rps for r in runs])
    store, described = variant.store(phase)
    unexpected = sum(s["other"] for s in served) + (sum(s["403"] for s in served)
                                                     if variant.name != "django-ratelimit" else 0)
    notes = [f"{variant.framework}; store: {described}"]
    if variant.name == "django-ratelimit":
        notes.append("refuses with 403 (its default)")
    if unexpected:
        notes.append(f"{unexpected} unexpected answers (not 2xx/429)")
    return Row(
        library=variant.label(), scenario=sc.key, group="wsgi", title=sc.title, store=store, driver="live",
        concurrency=concurrency, requests=m.requests, rps=m.rps, allowed=m.allowed, throttled=refused,
        errors=m.errors + served[index]["other"], success_pct=100.0 * m.allowed / n,
        throttled_pct=100.0 * refused / max(1, sum(served[index].values())),
        lat_mean_ms=lat["mean"], p50_ms=lat["p50"], p95_ms=lat["p95"], p99_ms=lat["p99"], p999_ms=lat["p999"],
        expected_allowed=None if limit is None else min(sc.limit, sum(served[index].values())),
        correct=None if limit is None else all(exact), iterations=len(runs), rps_runs=[r.rps for r in runs],
        cpu_pct=m.cpu_pct, rss_mb=m.rss_mb, note="; ".join(notes), workers=workers,
        admitted=admitted[index], admitted_max=max(admitted), limit=limit,
        over_limit=limit is not None and max(admitted) > limit, admitted_source="handler",
        measure=sc.measure, rps_min=rounds.min if rounds else None, rps_max=rounds.max if rounds else None,
        rps_cv_pct=rounds.cv_pct if rounds else None,
    )


def _missing_row(variant: LiveVariant, sc: Scenario, phase: str, workers: int, concurrency: int, why: str) -> Row:
    store, described = variant.store(phase)
    return Row(library=variant.label(), scenario=sc.key, group="wsgi", title=sc.title, store=store, driver="live",
               concurrency=concurrency, requests=0, rps=0.0, allowed=0, throttled=0, errors=0, success_pct=0.0,
               throttled_pct=0.0, lat_mean_ms=0.0, p50_ms=0.0, p95_ms=0.0, p99_ms=0.0, p999_ms=0.0,
               expected_allowed=None, correct=None, iterations=0, rps_runs=[], workers=workers,
               note=f"{variant.framework}; store: {described}; MISSING: {why}", measure=sc.measure)


def _framework(row: Row) -> str:
    return row.note.split(";", 1)[0]


def add_ratios(rows: Sequence[Row]) -> None:
    """Each row's ratio to the bare app of its framework in the same scenario: of the medians, and the
    lowest and highest round by round (round i of both ran close together: they are interleaved)."""
    bare = {(r.scenario, _framework(r)): r for r in rows if r.library.endswith(" bare") and r.iterations}
    for r in rows:
        base = bare.get((r.scenario, _framework(r)))
        if base is None or base is r or not base.rps or not r.iterations:
            continue
        r.vs_bare = r.rps / base.rps
        paired = [a / b for a, b in zip(r.rps_runs, base.rps_runs, strict=False) if b]
        if paired and len(paired) == len(r.rps_runs) == len(base.rps_runs):
            r.vs_bare_min, r.vs_bare_max = min(paired), max(paired)


# ---------------------------------------------------------------------------------------------- tables

def live_table(rows: Sequence[Row]) -> str:
    """The live rows as a Markdown table: admitted / limit first, then req/s (median and min of the
    rounds), the spread, the ratio to the bare app of the same framework, latency and answers."""
    head = ("scenario", "library", "store", "admitted / limit", "exact", "req/s median", "req/s min",
            "rounds min-max (cv)", "x bare (median)", "x bare by round", "p50 ms", "p99 ms", "2xx (wrk)",
            "refused", "errors", "note")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if not r.iterations:
            lines.append(f"| {r.scenario} | {r.library} | {r.store} | MISSING |" + " |" * (len(head) - 5)
                         + f" {r.note} |")
            continue
        flag = "⚠ " if r.over_limit else ""
        ratio = f"{flag}{r.vs_bare:.2f}" if r.vs_bare is not None else "-"
        cells = (r.scenario, r.library, r.store, r.admitted_cell, r.exact_cell, f"{flag}{r.rps:,.0f}",
                 f"{flag}{r.rps_min:,.0f}" if r.rps_min is not None else "-", r.spread_cell, ratio,
                 r.ratio_spread_cell or "-", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}", f"{r.allowed:,}",
                 f"{r.throttled:,}", str(r.errors), r.note)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def over_limit_lines(rows: Sequence[Row]) -> list[str]:
    """One line per row that admitted more than its limit."""
    return [f"⚠ {r.library} · {r.scenario} · {r.store}: admitted {r.admitted_cell.lstrip('⚠ ')} "
            f"({r.workers} workers: a per-process count admits up to {r.workers} x the limit)"
            for r in rows if r.over_limit]


def describe(workers: int, duration: float, rounds: int, warmup: int, concurrency: int) -> str:
    """How the live rows were made, for the reports (wrk runs one thread: ``drivers.live`` gives it
    one per client core, and nothing is pinned with several workers)."""
    return (f"gunicorn, {workers} sync workers per server, every server of a scenario up at once; wrk -t1 "
            f"-c{concurrency} -d{duration:g}s, {warmup} warm-up + {rounds} timed rounds, variants interleaved "
            f"(each round starts one further on); one hot key (X-Client-ID), a fresh one per run; admitted = "
            f"the workers' own 2xx count; wsgi.limited: {LIMIT} per day per key; wsgi.allowed: 10^9 per day")


def as_dicts(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The rows as JSON-ready dicts."""
    return [r.to_dict() for r in rows]
