"""WSGI benchmark: bare Flask and Django, flask-limiter, django-ratelimit and ratewarden's
WSGI integrations (``ratewarden.wsgi.RateLimitMiddleware``, ``ratewarden.flask``, ``ratewarden.django``),
timed in one process by direct PEP 3333 calls (no socket, no server): a fresh environ per request,
``app(environ, start_response)``, the body consumed and ``close()`` called.

Variants are interleaved in rounds (every variant measured once per round, the order rotated) so drift
and noise hit them alike; each row reports the min and the median µs per request over the rounds and
the extra over the bare app of its framework. Every limiting row also reports exactness: a burst of
``EXACT_CALLS`` requests from ``EXACT_THREADS`` threads against a fresh limit of ``EXACT_LIMIT``.

Memory rows first (each limiter's in-process store: flask-limiter ``memory://``, django-ratelimit on
Django's ``LocMemCache``, ratewarden's ``MemoryStore``), then Redis rows (one ``redis-server`` on a free
loopback port, started here: flask-limiter ``redis://``, django-ratelimit on Django's ``RedisCache``,
ratewarden's ``RedisStore`` through its synchronous ``hit_blocking``).

The apps and the calls are in ``wsgi_apps``; the live rows (the same apps under gunicorn and wrk) in
``wsgi_live``. ``ratewarden bench --wsgi`` runs both (``--driver`` keeps one); ``scripts/bench_wsgi.py``
is a command line over the same modules.
"""

from __future__ import annotations

import gc
import statistics
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .wsgi_apps import (
    ALLOW,
    EXACT_CALLS,
    EXACT_LIMIT,
    EXACT_THREADS,
    PATH,
    Floor429,
    FloorHeaders,
    FloorRedis,
    WSGIApp,
    base_environ,
    burst,
    call,
    django_bare,
    django_ratelimit_app,
    flask_bare,
    flask_limiter_app,
    rw_django,
    rw_django_mw,
    rw_flask,
    rw_wsgi_flask,
    timed,
    use_django_cache,
)

__all__ = [
    "EXACT_CALLS", "EXACT_LIMIT", "EXACT_THREADS", "PATH", "Row", "Variant", "measure", "row_table",
    "run", "target_table", "targets", "variants", "write",
]


# ---------------------------------------------------------------------------------------------- variants

@dataclass
class Variant:
    """One row: how to build its app (``build(limit)`` → (app, path)); ``kind`` is ``allowed``, ``429``
    (``403`` for django-ratelimit's block) or ``floor``."""

    name: str
    framework: str
    store: str
    kind: str
    build: Callable[[int], tuple[WSGIApp, str]]
    note: str = ""
    exact: bool = True  # burst of EXACT_CALLS against a limit of EXACT_LIMIT
    before: Callable[[], None] | None = None  # run before each timed batch (e.g. which Django cache)


@dataclass
class Row:
    name: str
    framework: str
    store: str
    kind: str
    status: int = 0
    us_min: float = 0.0
    us_median: float = 0.0
    extra_min: float | None = None
    extra_median: float | None = None
    admitted: int | None = None
    limit: int | None = None
    calls: int | None = None
    statuses: dict[int, int] = field(default_factory=dict)
    missing: str = ""
    note: str = ""
    samples: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _flask(build: Callable[[int], WSGIApp]) -> Callable[[int], tuple[WSGIApp, str]]:
    return lambda limit: (build(limit), PATH)


def variants(store: str, redis_url: str = "", django: bool = True, flask: bool = True) -> list[Variant]:
    """The rows of one store phase (``memory`` or ``redis``)."""
    out: list[Variant] = []
    fl_uri = "memory://" if store == "memory" else redis_url
    if flask:
        if store == "memory":
            out += [
                Variant("flask bare", "flask", "-", "bare", _flask(lambda _: flask_bare()), exact=False),
                Variant("floor: +5 fixed headers", "flask", "-", "floor-allowed",
                        _flask(lambda _: FloorHeaders(flask_bare())), exact=False),
                Variant("floor: fixed 429", "flask", "-", "floor-429",
                        _flask(lambda _: Floor429(flask_bare())), exact=False),
            ]
        else:
            out += [
                Variant("flask bare", "flask", "-", "bare", _flask(lambda _: flask_bare()), exact=False),
                Variant("floor: 1 redis round trip + 5 headers", "flask", "redis", "floor-allowed",
                        _flask(lambda _: FloorRedis(flask_bare(), redis_url)), exact=False),
            ]
        out += [
            Variant("flask-limiter", "flask", store, "allowed", _flask(lambda n: flask_limiter_app(n, fl_uri)),
                    note="no rate-limit headers (its default)"),
            Variant("flask-limiter", "flask", store, "429", _flask(lambda n: flask_limiter_app(n, fl_uri))),
            Variant("ratewarden.flask", "flask", store, "allowed",
                    _flask(lambda n: rw_flask(n, store, redis_url))),
            Variant("ratewarden.flask", "flask", store, "429", _flask(lambda n: rw_flask(n, store, redis_url))),
            Variant("ratewarden.wsgi middleware", "flask", store, "allowed",
                    _flask(lambda n: rw_wsgi_flask(n, store, redis_url)), note="headers: both styles"),
            Variant("ratewarden.wsgi middleware", "flask", store, "429",
                    _flask(lambda n: rw_wsgi_flask(n, store, redis_url))),
        ]
    if django:
        cache = "default" if store == "memory" else "redis"

        def before() -> None:
            use_django_cache(cache)

        out.append(Variant("django bare", "django", "-", "bare", lambda _: django_bare(redis_url), exact=False))
        if store == "memory":
            out += [
                Variant("floor: +5 fixed headers", "django", "-", "floor-allowed",
                        lambda _: (FloorHeaders(django_bare(redis_url)[0]), PATH), exact=False),
            ]
        drl_store = "LocMemCache" if store == "memory" else "RedisCache"
        out += [
            Variant("django-ratelimit", "django", store, "allowed", lambda n: django_ratelimit_app(n, redis_url),
                    note=f"cache: {drl_store}", before=before),
            Variant("django-ratelimit", "django", store, "403", lambda n: django_ratelimit_app(n, redis_url),
                    note="block=True: Ratelimited -> 403 (its default), not 429", before=before),
            Variant("ratewarden.django", "django", store, "allowed", lambda n: rw_django(n, store, redis_url)),
            Variant("ratewarden.django", "django", store, "429", lambda n: rw_django(n, store, redis_url)),
            Variant("ratewarden.django middleware", "django", store, "allowed",
                    lambda n: rw_django_mw(n, store, redis_url), note="settings.RATEWARDEN rules"),
            Variant("ratewarden.django middleware", "django", store, "429",
                    lambda n: rw_django_mw(n, store, redis_url)),
        ]
    return out


# ---------------------------------------------------------------------------------------------- measure

def _missing_reason(exc: BaseException) -> str:
    if isinstance(exc, ImportError):
        return f"not importable ({exc})"
    if isinstance(exc, NotImplementedError):
        return f"not implemented ({exc})"
    return f"{type(exc).__name__}: {exc}"


def measure(vs: Sequence[Variant], *, requests: int = 2000, rounds: int = 7, warmup: int = 200,
            exact: bool = True, log: Callable[[str], None] = print, verbose: bool = False) -> list[Row]:
    """Builds every variant, checks its status, then interleaves ``rounds`` rounds of ``requests``
    requests each (the order rotated every round); exactness bursts after the timing."""
    rows: list[Row] = []
    live: list[tuple[Variant, Row, WSGIApp, dict[str, Any]]] = []
    for v in vs:
        row = Row(v.name, v.framework, v.store, v.kind, note=v.note)
        rows.append(row)
        try:
            if v.before is not None:
                v.before()
            if v.kind in ("429", "403"):
                app, path = v.build(1)
                base = base_environ(path)
                call(app, base)  # the one allowed request: every later one is refused
            else:
                app, path = v.build(ALLOW)
                base = base_environ(path)
            for _ in range(warmup):
                status = call(app, base)
            row.status = status
            want = {"bare": 200, "floor-allowed": 200, "allowed": 200, "floor-429": 429, "429": 429, "403": 403}[v.kind]
            if status != want:
                row.missing = f"answered {status}, expected {want}"
                continue
        except Exception as exc:
            row.missing = _missing_reason(exc)
            if verbose:
                traceback.print_exc()
            continue
        live.append((v, row, app, base))
    for r in range(rounds):
        shift = r % max(1, len(live))
        order = live[shift:] + live[:shift]
        for v, row, app, base in order:
            if v.before is not None:
                v.before()
            gc.collect()
            us, status = timed(app, base, requests)
            if status != row.status:
                row.missing = f"answered {status} in round {r}, {row.status} before"
            row.samples.append(us)
        log(f"  round {r + 1}/{rounds} done")
    for _, row, _, _ in live:
        if row.samples:
            row.us_min = min(row.samples)
            row.us_median = statistics.median(row.samples)
    bare = {row.framework: row for _, row, _, _ in live if row.kind == "bare"}
    for _, row, _, _ in live:
        b = bare.get(row.framework)
        if b is not None and row.kind != "bare":
            row.extra_min = row.us_min - b.us_min
            row.extra_median = row.us_median - b.us_median
    if exact:
        for v, row, _, _ in live:
            if not v.exact:
                continue
            if v.before is not None:
                v.before()
            try:
                app, path = v.build(EXACT_LIMIT)
                admitted, counts = burst(_at(app, path))
            except Exception as exc:
                row.missing = row.missing or f"exactness: {_missing_reason(exc)}"
                continue
            row.admitted, row.limit, row.calls, row.statuses = admitted, EXACT_LIMIT, EXACT_CALLS, counts
    return rows


def _at(app: WSGIApp, path: str) -> WSGIApp:
    """``app`` with every request sent to ``path`` (the burst's environ is built for ``PATH``)."""
    if path == PATH:
        return app

    def routed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        environ["PATH_INFO"] = path
        return app(environ, start_response)

    return routed


# ---------------------------------------------------------------------------------------------- targets

def _find(rows: Sequence[Row], name: str, store: str, kind: str) -> Row | None:
    for row in rows:
        if row.name == name and row.kind == kind and row.store == store and not row.missing:
            return row
    return None


def targets(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The targets, each with target / ours / floor (µs) from the medians and from the minima
    of the rounds (on a shared machine the minima are the steadier), and whether each is met.

    * allowed: ratewarden's extra over bare Flask <= 0.05x flask-limiter's extra (memory), <= 0.25x
      (Redis); floor: the fixed-headers layer's extra (Redis: one redis-py round trip + the headers).
    * 429: the whole cost of a refused request (µs per 429 answer: a 429 never runs the view, so an
      extra over bare means little) <= 0.1x flask-limiter's; floor: the fixed-429 layer.
    * Django: ratewarden.django (decorator, middleware) below django-ratelimit on every row (allowed
      extra; 429 against its 403, whole cost).
    """
    out: list[dict[str, Any]] = []
    floors_h = {"memory": _find(rows, "floor: +5 fixed headers", "-", "floor-allowed"),
                "redis": _find(rows, "floor: 1 redis round trip + 5 headers", "redis", "floor-allowed")}
    floor_429 = _find(rows, "floor: fixed 429", "-", "floor-429")

    def extra(stat: str) -> Callable[[Row | None], float | None]:
        return lambda r: None if r is None else (r.extra_median if stat == "median" else r.extra_min)

    def whole(stat: str) -> Callable[[Row | None], float | None]:
        return lambda r: None if r is None else (r.us_median if stat == "median" else r.us_min)

    def add(what: str, rule: str, factor: float, theirs: Row | None, ours: Row | None, floor: Row | None,
            pick: Callable[[str], Callable[[Row | None], float | None]], strict: bool = False) -> None:
        entry: dict[str, Any] = {"target": what, "rule": rule}
        for stat, suffix in (("median", ""), ("min", "_min")):
            value = pick(stat)
            t = value(theirs)
            target = None if t is None else factor * t
            o, f = value(ours), value(floor)
            met = None if target is None or o is None else (o < target if strict else o <= target)
            entry.update({f"target_us{suffix}": target, f"ours_us{suffix}": o, f"floor_us{suffix}": f,
                          f"met{suffix}": met})
        out.append(entry)

    for store, factor in (("memory", 0.05), ("redis", 0.25)):
        fl = _find(rows, "flask-limiter", store, "allowed")
        fl429 = _find(rows, "flask-limiter", store, "429")
        for ours_name in ("ratewarden.flask", "ratewarden.wsgi middleware"):
            add(f"{ours_name} allowed extra ({store})", f"<= {factor}x flask-limiter's extra", factor, fl,
                _find(rows, ours_name, store, "allowed"), floors_h[store], extra)
        for ours_name in ("ratewarden.flask", "ratewarden.wsgi middleware"):
            add(f"{ours_name} 429 cost ({store})", "<= 0.1x flask-limiter's 429", 0.1, fl429,
                _find(rows, ours_name, store, "429"), floor_429, whole)
        for kind, theirs_kind, what in (("allowed", "allowed", "extra"), ("429", "403", "total")):
            drl = _find(rows, "django-ratelimit", store, theirs_kind)
            for ours_name in ("ratewarden.django", "ratewarden.django middleware"):
                add(f"{ours_name} {kind} {what} ({store})", f"< django-ratelimit {theirs_kind} {what}", 1.0, drl,
                    _find(rows, ours_name, store, kind), None, extra if what == "extra" else whole, strict=True)
    return out


# ---------------------------------------------------------------------------------------------- tables

def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def row_table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table."""
    head = ("variant", "fw", "store", "row", "status", "min µs", "median µs", "extra min", "extra med",
            "admitted/limit")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.missing:
            cells = (r.name, r.framework, r.store, r.kind, "-", "-", "-", "-", "-", f"MISSING: {r.missing}")
        else:
            exact = "-" if r.admitted is None else f"{r.admitted}/{r.limit} (of {r.calls})"
            cells = (r.name, r.framework, r.store, r.kind, str(r.status), _fmt(r.us_min), _fmt(r.us_median),
                     _fmt(r.extra_min), _fmt(r.extra_median), exact)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def target_table(ts: Sequence[dict[str, Any]]) -> str:
    """``targets`` as a Markdown table (medians / minima)."""
    def met(value: bool | None) -> str:
        return "n/a (row missing)" if value is None else ("yes" if value else "NO")

    lines = ["| target | rule | target µs (med / min) | ours µs (med / min) | floor µs (med / min) | met (med / min) |",
             "|---|---|---|---|---|---|"]
    for t in ts:
        lines.append(
            f"| {t['target']} | {t['rule']} | {_fmt(t['target_us'])} / {_fmt(t['target_us_min'])} | "
            f"{_fmt(t['ours_us'])} / {_fmt(t['ours_us_min'])} | {_fmt(t['floor_us'])} / {_fmt(t['floor_us_min'])} | "
            f"{met(t['met'])} / {met(t['met_min'])} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- ratewarden bench --wsgi

def run(stores: Sequence[str], *, redis_url: str = "", rounds: int = 5, requests: int = 1000,
        log: Callable[[str], None] = print) -> tuple[list[Row], list[dict[str, Any]]]:
    """The in-process rows on each of ``stores`` (``memory``, ``redis``: a private ``redis-server``
    unless ``redis_url``), and the targets. Raises ``BenchError`` when Redis cannot be had."""
    import contextlib

    from .services import StoreService

    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        if "redis" in stores:
            redis_url = stack.enter_context(StoreService("redis", redis_url)).url
        for store in stores:
            log(f"WSGI rows, {store}: {rounds} rounds x {requests} requests")
            rows += measure(variants(store, redis_url), requests=requests, rounds=rounds, log=lambda _: None)
    return rows, targets(rows)


def write(out: Any, rows: Sequence[Row], ts: Sequence[dict[str, Any]], live: Sequence[Any] = (),
          live_method: str = "") -> str:
    """``wsgi.md`` and ``wsgi.json`` in the directory ``out``: the in-process ``rows`` and their
    targets ``ts``, then the ``live`` rows (``wsgi_live``, ``results.Row``s) made as ``live_method``
    says; returns the Markdown."""
    import json
    from pathlib import Path

    from .wsgi_live import live_table, over_limit_lines

    md = "# WSGI rows\n"
    if rows:
        md += (f"\nIn-process, µs per request (min and median of the rounds; extra over the bare app "
               f"of the same framework); exactness: {EXACT_CALLS} requests from {EXACT_THREADS} threads against a "
               f"limit of {EXACT_LIMIT}.\n\n{row_table(rows)}\n\n## Targets\n\n{target_table(ts)}\n")
    if live:
        over = over_limit_lines(live)
        md += (f"\n## Live: gunicorn + wrk\n\n{live_method}.\n\nreq/s: the median round's and the slowest "
               "round's (min); x bare: against the bare app of the same framework in the same scenario.\n\n"
               + ("".join(f"- {line}\n" for line in over) + "\n" if over else "")
               + f"{live_table(live)}\n")
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "wsgi.md").write_text(md, encoding="utf-8")
    data = {"rows": [r.as_dict() for r in rows], "targets": list(ts),
            "live": [r.to_dict() for r in live], "live_method": live_method}
    (path / "wsgi.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    return md
