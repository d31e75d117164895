"""The apps of the WSGI benchmark (``ratewarden.bench.wsgi``): bare Flask and Django, flask-limiter,
django-ratelimit, ratewarden's WSGI integrations and the floors, each built for a given limit; the
PEP 3333 calls that time them (``call``, ``timed``, ``burst``). The live rows serve them under
gunicorn through ``wsgi_live_apps``.

This module is also Django's ``ROOT_URLCONF`` in the benchmark process (``urlpatterns``).
"""

from __future__ import annotations

import io
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = [
    "ALLOW", "EXACT_CALLS", "EXACT_LIMIT", "EXACT_THREADS", "KEY_HEADER", "PATH", "Floor429", "FloorHeaders",
    "FloorRedis", "WSGIApp", "base_environ", "burst", "call", "django_bare", "django_handler",
    "django_ratelimit_app", "flask_bare", "flask_limiter_app", "rw_django", "rw_django_mw", "rw_flask",
    "rw_limiter", "rw_wsgi_flask", "timed", "use_django_cache",
]

ALLOW = 10**9  # a limit never reached in a run: every request allowed
EXACT_LIMIT = 100
EXACT_CALLS = 150
EXACT_THREADS = 8
PATH = "/test"
CLIENT_IP = "10.1.2.3"
#: The live rows' key: a fresh value per wrk run (one hot key), so no run finds a counter used up.
KEY_HEADER = "X-Client-ID"

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
# Names and key prefixes differ per run (``RW_BENCH_RUN``, set per gunicorn server; else per process), so
# a shared Redis never hands one run the counters an earlier run used up.
_RUN = os.environ.get("RW_BENCH_RUN") or uuid.uuid4().hex[:8]


def _uid(tag: str) -> str:
    _counter[0] += 1
    return f"{tag}{_RUN}-{_counter[0]}"


def flask_bare() -> WSGIApp:
    from flask import Flask

    app = Flask(_uid("bench"))

    @app.get(PATH)
    def test() -> dict[str, bool]:
        return {"ok": True}

    return app


def flask_limiter_app(limit: int, storage_uri: str, *, per: str = "hour", key: str = "ip") -> WSGIApp:
    """Flask + flask-limiter (its defaults: fixed window, no rate-limit headers), ``limit`` per ``per``
    per client IP (``key="header"``: per ``X-Client-ID``, the IP without one)."""
    from flask import Flask, request
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address

    def by_header() -> str:
        return request.headers.get(KEY_HEADER) or get_remote_address()

    app = Flask(_uid("bench"))
    fl = Limiter(by_header if key == "header" else get_remote_address, app=app, storage_uri=storage_uri,
                 key_prefix=_uid("fl"))

    @app.get(PATH)
    @fl.limit(f"{limit}/{per}")
    def test() -> dict[str, bool]:
        return {"ok": True}

    return app


def rw_limiter(store: str, redis_url: str, timeout: float | None = None) -> Any:
    """ratewarden's ``Limiter`` on ``store``: ``memory``, ``shm`` (``redis_url`` is then the store's
    ``shm://`` URL) or ``redis`` (its check timeout ``timeout``, else the store's default)."""
    from ratewarden import Limiter
    from ratewarden.stores.memory import MemoryStore

    # Fail closed with no insurance limiter: a failing check answers 503, which the run reports as a
    # wrong status, instead of being allowed (fail open) and timed as if it had been checked.
    if store == "memory":
        return Limiter(MemoryStore(), prefix=_uid("rw"), on_error="closed", fallback=None)
    if store == "shm":
        from ratewarden.stores.urls import open_store

        return Limiter(open_store(redis_url), prefix=_uid("rw"), on_error="closed", fallback=None)
    from ratewarden.stores.redis import RedisStore

    prefix = _uid("rw")
    redis = RedisStore(redis_url, prefix=prefix) if timeout is None else RedisStore(redis_url, prefix=prefix,
                                                                                   timeout=timeout)
    return Limiter(redis, prefix=prefix, on_error="closed", fallback=None)


def _rw_key(key: str) -> Any:
    """ratewarden's key function: ``None`` (the client IP, its default) or the ``X-Client-ID`` header,
    stored as it is (the peers store it unhashed too), the IP without one."""
    if key != "header":
        return None
    from ratewarden.keys import header

    return header(KEY_HEADER, hashed=False)


def rw_wsgi_flask(limit: int, store: str, redis_url: str = "", *, per: str = "hour", key: str = "ip",
                  timeout: float | None = None) -> WSGIApp:
    """Flask wrapped in ``ratewarden.wsgi.RateLimitMiddleware`` (defaults: both header styles)."""
    from ratewarden import Rule
    from ratewarden.wsgi import RateLimitMiddleware

    k = _rw_key(key)
    rule = Rule(PATH, f"{limit}/{per}") if k is None else Rule(PATH, f"{limit}/{per}", key=k)
    return RateLimitMiddleware(flask_bare(), rw_limiter(store, redis_url, timeout), [rule])


def rw_flask(limit: int, store: str, redis_url: str = "", *, per: str = "hour", key: str = "ip",
             timeout: float | None = None) -> WSGIApp:
    """Flask + the ``ratewarden.flask`` extension, ``@limiter.limit("N/hour")`` on the view."""
    from flask import Flask

    from ratewarden.flask import RateLimiter  # type: ignore[import-not-found,unused-ignore]

    app = Flask(_uid("bench"))
    ext = RateLimiter(app, limiter=rw_limiter(store, redis_url, timeout), key=_rw_key(key))

    @app.get(PATH)
    @ext.limit(f"{limit}/{per}")
    def test() -> dict[str, bool]:
        return {"ok": True}

    return app


# ---------------------------------------------------------------------------------------------- Django

_DJANGO_VIEWS: dict[str, Callable[..., Any]] = {}
urlpatterns: list[Any] = []  # this module is Django's ROOT_URLCONF


def _django_setup(redis_url: str = "") -> None:
    import django  # type: ignore[import-untyped]
    from django.conf import settings  # type: ignore[import-untyped]

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
    from django.urls import path  # type: ignore[import-untyped]

    _DJANGO_VIEWS[name] = view
    urlpatterns.insert(0, path(name, view))
    _clear_url_caches()
    return "/" + name


def _clear_url_caches() -> None:
    from django.urls import clear_url_caches

    clear_url_caches()


def _plain_view(request: Any) -> Any:
    from django.http import JsonResponse  # type: ignore[import-untyped]

    return JsonResponse({"ok": True})


def django_handler(middleware: Sequence[str] = ()) -> WSGIApp:
    from django.conf import settings
    from django.core.handlers.wsgi import WSGIHandler  # type: ignore[import-untyped]

    before = settings.MIDDLEWARE
    settings.MIDDLEWARE = list(middleware)
    try:
        handler: WSGIApp = WSGIHandler()  # loads the middleware chain now
        return handler
    finally:
        settings.MIDDLEWARE = before


def django_bare(redis_url: str = "") -> tuple[WSGIApp, str]:
    _django_setup(redis_url)
    if not any(getattr(p, "name", None) == "bare" for p in urlpatterns):
        from django.urls import path

        urlpatterns.append(path(PATH[1:], _plain_view, name="bare"))
        _clear_url_caches()
    return django_handler(), PATH


def django_ratelimit_app(limit: int, redis_url: str = "", *, per: str = "hour",
                         key: str = "ip") -> tuple[WSGIApp, str]:
    """Django + django-ratelimit's ``@ratelimit(key="ip", rate="N/h", block=True)`` (blocked: its
    ``Ratelimited``, a ``PermissionDenied``, answered 403 by Django; ``key="header"``: its
    ``header:x-client-id`` key)."""
    from django_ratelimit.decorators import ratelimit  # type: ignore[import-untyped]

    handler, _ = django_bare(redis_url)
    name = _uid("drl")
    drl_key = f"header:{KEY_HEADER.lower()}" if key == "header" else "ip"
    view = ratelimit(group=name, key=drl_key, rate=f"{limit}/{per[0]}", block=True)(_plain_view)  # a counter per view
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
    view = rw_limit(f"{limit}/hour", key="ip", limiter=rw_limiter(store, redis_url))(_plain_view)
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
    from django.test.signals import setting_changed  # type: ignore[import-untyped]
    from django.urls import path as route

    value = {
        "STORE": rw_limiter(store, redis_url).store,
        "ON_ERROR": "closed",
        "RULES": [
            {"path": f"/rwmw-{store}-{_RUN}-allow", "rate": f"{ALLOW}/hour"},
            {"path": f"/rwmw-{store}-{_RUN}-deny", "rate": "1/hour"},
            *({"path": f"/rwmw-{store}-{_RUN}-exact{i}", "rate": f"{EXACT_LIMIT}/hour"} for i in range(_RW_DJANGO_EXACT)),
        ],
    }
    settings.RATEWARDEN = value
    setting_changed.send(sender=None, setting="RATEWARDEN", value=value, enter=True)
    for name in ("allow", "deny", *(f"exact{i}" for i in range(_RW_DJANGO_EXACT))):
        urlpatterns.insert(0, route(f"rwmw-{store}-{_RUN}-{name}", _plain_view))
    _clear_url_caches()
    _RW_DJANGO_PHASE.append(store)


_rw_django_exact_used: dict[str, int] = {}


def rw_django_mw(limit: int, store: str, redis_url: str = "") -> tuple[WSGIApp, str]:
    """Django + ``ratewarden.django.RateLimitMiddleware`` (rules from ``settings.RATEWARDEN``)."""
    import ratewarden.django  # noqa: F401 - missing row if it does not import

    django_bare(redis_url)
    _rw_django_settings(store, redis_url)
    handler = django_handler(["ratewarden.django.RateLimitMiddleware"])
    if limit == ALLOW:
        which = "allow"
    elif limit == 1:
        which = "deny"
    else:
        used = _rw_django_exact_used.get(store, 0)
        _rw_django_exact_used[store] = used + 1
        which = f"exact{used}"
    return handler, f"/rwmw-{store}-{_RUN}-{which}"
