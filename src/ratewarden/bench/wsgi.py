"""WSGI benchmark (issue 23): bare Flask and Django, flask-limiter, django-ratelimit and ratewarden's
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

``scripts/bench_wsgi.py`` is the command line; ``live`` runs the same Flask apps under gunicorn and wrk.
The apps are also importable by gunicorn: ``ratewarden.bench.wsgi:gunicorn_app("flask-limiter", "allow")``.
"""

from __future__ import annotations

import gc
import io
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "EXACT_CALLS", "EXACT_LIMIT", "Row", "Variant", "base_environ", "call", "gunicorn_app", "measure",
    "targets", "variants",
]

ALLOW = 10**9  # a limit never reached in a run: every request allowed
EXACT_LIMIT = 100
EXACT_CALLS = 150
EXACT_THREADS = 8
PATH = "/test"
CLIENT_IP = "10.1.2.3"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


# ---------------------------------------------------------------------------------------------- calls

def base_environ(path: str = PATH, remote: str = CLIENT_IP) -> dict[str, Any]:
    """A PEP 3333 environ of a plain ``GET path`` (copied per request; ``wsgi.input`` set per request)."""
    return {
        "REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": "",
        "SERVER_NAME": "bench.local", "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": remote, "REMOTE_PORT": "50000", "HTTP_HOST": "bench.local",
        "HTTP_USER_AGENT": "ratewarden-bench", "HTTP_ACCEPT": "*/*", "CONTENT_LENGTH": "",
        "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": None, "wsgi.errors": sys.stderr,
        "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
    }


def _write(data: bytes) -> None:  # the legacy write() callable: unused by these apps
    return None


class _Start:
    """``start_response``: keeps the last status line."""

    __slots__ = ("status",)

    def __init__(self) -> None:
        self.status = ""

    def __call__(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        self.status = status
        return _write


def call(app: WSGIApp, base: dict[str, Any]) -> int:
    """One request: a fresh environ, the body consumed, ``close()`` called; the status code."""
    start = _Start()
    env = base.copy()
    env["wsgi.input"] = io.BytesIO(b"")
    body = app(env, start)
    try:
        for _ in body:
            pass
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()
    return int(start.status[:3])


def timed(app: WSGIApp, base: dict[str, Any], n: int) -> tuple[float, int]:
    """µs per request over ``n`` requests, and the status code of the last one."""
    start = _Start()
    bio = io.BytesIO
    t0 = time.perf_counter_ns()
    for _ in range(n):
        env = base.copy()
        env["wsgi.input"] = bio(b"")
        body = app(env, start)
        for _ in body:
            pass
        close = getattr(body, "close", None)
        if close is not None:
            close()
    elapsed = time.perf_counter_ns() - t0
    return elapsed / n / 1000.0, int(start.status[:3])


def burst(app: WSGIApp, calls: int = EXACT_CALLS, threads: int = EXACT_THREADS) -> tuple[int, dict[int, int]]:
    """``calls`` requests from ``threads`` threads at once: how many were admitted (2xx), and every status."""
    base = base_environ()
    with ThreadPoolExecutor(threads) as pool:
        statuses = list(pool.map(lambda _: call(app, base), range(calls)))
    counts: dict[int, int] = {}
    for s in statuses:
        counts[s] = counts.get(s, 0) + 1
    return sum(v for k, v in counts.items() if 200 <= k < 300), counts


# ---------------------------------------------------------------------------------------------- floors

_FIXED_HEADERS = [
    ("RateLimit-Policy", '"x";q=1000;w=60'), ("RateLimit", '"x";r=999;t=60'),
    ("X-RateLimit-Limit", "1000"), ("X-RateLimit-Remaining", "999"), ("X-RateLimit-Reset", "60"),
]
_PROBLEM = b'{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"Rate limit exceeded"}'
_PROBLEM_HEADERS = [("Content-Type", "application/problem+json"), ("Content-Length", str(len(_PROBLEM))),
                    ("Retry-After", "60"), *_FIXED_HEADERS]


class FloorHeaders:
    """The floor of a limiter that lets a request through: a WSGI layer adding five precomputed
    rate-limit headers (a new list, as a wrapped ``start_response`` must) and limiting nothing."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, [*headers, *_FIXED_HEADERS], exc_info)

        return self.app(environ, start)


class Floor429:
    """The floor of a 429: a WSGI layer answering a fixed problem+json 429 (with ``Retry-After`` and the
    five rate-limit headers) without calling the app."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        start_response("429 Too Many Requests", list(_PROBLEM_HEADERS))
        return [_PROBLEM]


class FloorRedis:
    """The floor of a Redis-backed limiter that lets a request through: one round trip on redis-py's
    synchronous client (``EVALSHA`` of a one-line script on one key, its reply unused), then the
    five fixed headers; limits nothing."""

    def __init__(self, app: WSGIApp, redis_url: str) -> None:
        import redis

        self.app = FloorHeaders(app)
        self.client = redis.Redis.from_url(redis_url)
        self.sha = self.client.script_load("return {1, 2, 3}")

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        self.client.evalsha(self.sha, 1, "rwbench:floor")
        return self.app(environ, start_response)


# ---------------------------------------------------------------------------------------------- Flask

_counter = [0]


def _uid(tag: str) -> str:
    _counter[0] += 1
    return f"{tag}{_counter[0]}"


def flask_bare() -> WSGIApp:
    from flask import Flask

    app = Flask(_uid("bench"))

    @app.get(PATH)
    def test() -> dict[str, bool]:
        return {"ok": True}

    return app  # type: ignore[return-value]


def flask_limiter_app(limit: int, storage_uri: str) -> WSGIApp:
    """Flask + flask-limiter (its defaults: fixed window, no rate-limit headers), ``limit``/hour per IP."""
    from flask import Flask
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address

    app = Flask(_uid("bench"))
    fl = Limiter(get_remote_address, app=app, storage_uri=storage_uri, key_prefix=_uid("fl"))

    @app.get(PATH)
    @fl.limit(f"{limit}/hour")
    def test() -> dict[str, bool]:
        return {"ok": True}

    return app  # type: ignore[return-value]


def _rw_limiter(store: str, redis_url: str) -> Any:
    from ratewarden import Limiter
    from ratewarden.stores.memory import MemoryStore

    # Fail closed with no insurance limiter: a failing check answers 503, which the run reports as a
    # wrong status, instead of being allowed (fail open) and timed as if it had been checked.
    if store == "memory":
        return Limiter(MemoryStore(), prefix=_uid("rw"), on_error="closed", fallback=None)
    from ratewarden.stores.base import Store
    from ratewarden.stores.redis import RedisStore

    if RedisStore.hit_blocking is Store.hit_blocking:
        raise NotImplementedError("RedisStore.hit_blocking (the synchronous Redis path) has not landed")
    prefix = _uid("rw")
    return Limiter(RedisStore(redis_url, prefix=prefix), prefix=prefix, on_error="closed", fallback=None)


def rw_wsgi_flask(limit: int, store: str, redis_url: str = "") -> WSGIApp:
    """Flask wrapped in ``ratewarden.wsgi.RateLimitMiddleware`` (defaults: both header styles)."""
    from ratewarden import Rule
    from ratewarden.wsgi import RateLimitMiddleware

    return RateLimitMiddleware(flask_bare(), _rw_limiter(store, redis_url), [Rule(PATH, f"{limit}/hour")])


def rw_flask(limit: int, store: str, redis_url: str = "") -> WSGIApp:
    """Flask + the ``ratewarden.flask`` extension, ``@limiter.limit("N/hour")`` on the view."""
    from flask import Flask

    from ratewarden.flask import RateLimiter  # type: ignore[import-not-found,unused-ignore]

    app = Flask(_uid("bench"))
    ext = RateLimiter(app, limiter=_rw_limiter(store, redis_url))

    @app.get(PATH)
    @ext.limit(f"{limit}/hour")
    def test() -> dict[str, bool]:
        return {"ok": True}

    return app  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------- Django

_DJANGO_VIEWS: dict[str, Callable[..., Any]] = {}
urlpatterns: list[Any] = []  # this module is Django's ROOT_URLCONF


def _django_setup(redis_url: str = "") -> None:
    import django
    from django.conf import settings

    if settings.configured:
        return
    caches: dict[str, Any] = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                                          "LOCATION": "bench", "OPTIONS": {"MAX_ENTRIES": 100000}}}
    if redis_url:
        caches["redis"] = {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": redis_url}
    settings.configure(
        DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__, MIDDLEWARE=[], SECRET_KEY="bench-only",
        INSTALLED_APPS=[], USE_TZ=True, CACHES=caches, RATELIMIT_USE_CACHE="default",
        # 4xx answers are logged by django.request at WARNING: silenced for every Django row alike.
        LOGGING={"version": 1, "disable_existing_loggers": False,
                 "loggers": {"django.request": {"level": "ERROR"}, "django": {"level": "ERROR"}}},
    )
    django.setup()


def _django_route(name: str, view: Callable[..., Any]) -> str:
    """Adds ``view`` at ``/<name>`` to the URLconf (before the bare view's ``/test``, so the bare row
    pays the most routing: the extras of the other rows are, if anything, understated)."""
    from django.urls import path

    _DJANGO_VIEWS[name] = view
    urlpatterns.insert(0, path(name, view))
    _clear_url_caches()
    return "/" + name


def _clear_url_caches() -> None:
    from django.urls import clear_url_caches

    clear_url_caches()


def _plain_view(request: Any) -> Any:
    from django.http import JsonResponse

    return JsonResponse({"ok": True})


def _django_handler(middleware: Sequence[str] = ()) -> WSGIApp:
    from django.conf import settings
    from django.core.handlers.wsgi import WSGIHandler

    before = settings.MIDDLEWARE
    settings.MIDDLEWARE = list(middleware)
    try:
        return WSGIHandler()  # loads the middleware chain now
    finally:
        settings.MIDDLEWARE = before


def django_bare(redis_url: str = "") -> tuple[WSGIApp, str]:
    _django_setup(redis_url)
    if not any(getattr(p, "name", None) == "bare" for p in urlpatterns):
        from django.urls import path

        urlpatterns.append(path(PATH[1:], _plain_view, name="bare"))
        _clear_url_caches()
    return _django_handler(), PATH


def django_ratelimit_app(limit: int, redis_url: str = "") -> tuple[WSGIApp, str]:
    """Django + django-ratelimit's ``@ratelimit(key="ip", rate="N/h", block=True)`` (blocked: its
    ``Ratelimited``, a ``PermissionDenied``, answered 403 by Django)."""
    from django_ratelimit.decorators import ratelimit

    handler, _ = django_bare(redis_url)
    name = _uid("drl")
    view = ratelimit(group=name, key="ip", rate=f"{limit}/h", block=True)(_plain_view)  # a counter per view
    return handler, _django_route(name, view)


def use_django_cache(name: str) -> None:
    """django-ratelimit's cache (``RATELIMIT_USE_CACHE``, read on every check): ``default`` or ``redis``."""
    from django.conf import settings

    settings.RATELIMIT_USE_CACHE = name


def rw_django(limit: int, store: str, redis_url: str = "") -> tuple[WSGIApp, str]:
    """Django + ``ratewarden.django``: ``@limit("N/hour", key="ip")`` on the view (the middleware
    variant: ``rw_django_mw``)."""
    from ratewarden.django import limit as rw_limit

    handler, _ = django_bare(redis_url)
    view = rw_limit(f"{limit}/hour", key="ip", limiter=_rw_limiter(store, redis_url))(_plain_view)
    return handler, _django_route(_uid("rwd"), view)


_RW_DJANGO_PHASE: list[str] = []
_RW_DJANGO_EXACT = 4  # exactness paths per phase (one per burst)


def _rw_django_settings(store: str, redis_url: str) -> None:
    """``settings.RATEWARDEN`` for ``ratewarden.django.RateLimitMiddleware`` in this phase: one rule per
    path (``/rwmw-<store>-allow``, ``-deny``, ``-exact<i>``), on this phase's store (rebuilt through
    Django's ``setting_changed`` signal, as ``override_settings`` does)."""
    if _RW_DJANGO_PHASE and _RW_DJANGO_PHASE[-1] == store:
        return
    from django.conf import settings
    from django.test.signals import setting_changed
    from django.urls import path as route

    value = {
        "STORE": _rw_limiter(store, redis_url).store,
        "ON_ERROR": "closed",
        "RULES": [
            {"path": f"/rwmw-{store}-allow", "rate": f"{ALLOW}/hour"},
            {"path": f"/rwmw-{store}-deny", "rate": "1/hour"},
            *({"path": f"/rwmw-{store}-exact{i}", "rate": f"{EXACT_LIMIT}/hour"} for i in range(_RW_DJANGO_EXACT)),
        ],
    }
    settings.RATEWARDEN = value
    setting_changed.send(sender=None, setting="RATEWARDEN", value=value, enter=True)
    for name in ("allow", "deny", *(f"exact{i}" for i in range(_RW_DJANGO_EXACT))):
        urlpatterns.insert(0, route(f"rwmw-{store}-{name}", _plain_view))
    _clear_url_caches()
    _RW_DJANGO_PHASE.append(store)


_rw_django_exact_used: dict[str, int] = {}


def rw_django_mw(limit: int, store: str, redis_url: str = "") -> tuple[WSGIApp, str]:
    """Django + ``ratewarden.django.RateLimitMiddleware`` (rules from ``settings.RATEWARDEN``)."""
    import ratewarden.django  # noqa: F401 - missing row if it does not import

    django_bare(redis_url)
    _rw_django_settings(store, redis_url)
    handler = _django_handler(["ratewarden.django.RateLimitMiddleware"])
    if limit == ALLOW:
        which = "allow"
    elif limit == 1:
        which = "deny"
    else:
        used = _rw_django_exact_used.get(store, 0)
        _rw_django_exact_used[store] = used + 1
        which = f"exact{used}"
    return handler, f"/rwmw-{store}-{which}"


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
    """The issue's targets, each with target / ours / floor (µs) from the medians and from the minima
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


# ---------------------------------------------------------------------------------------------- gunicorn

def gunicorn_app(variant: str, mode: str = "allow", store: str = "memory") -> WSGIApp:
    """A Flask app for gunicorn (``ratewarden.bench.wsgi:gunicorn_app("flask-limiter", "allow")``):
    ``mode`` is ``allow`` (a limit never reached) or ``exact`` (``RW_BENCH_LIMIT``, default 1000, per hour);
    the Redis URL, if any, comes from ``RW_BENCH_REDIS``."""
    limit = ALLOW if mode == "allow" else int(os.environ.get("RW_BENCH_LIMIT", "1000"))
    redis_url = os.environ.get("RW_BENCH_REDIS", "")
    if variant == "bare":
        return flask_bare()
    if variant == "flask-limiter":
        return flask_limiter_app(limit, "memory://" if store == "memory" else redis_url)
    if variant == "ratewarden.flask":
        return rw_flask(limit, store, redis_url)
    if variant == "ratewarden.wsgi":
        return rw_wsgi_flask(limit, store, redis_url)
    raise ValueError(f"unknown variant {variant!r}")
