"""The apps the WSGI benchmark's live rows serve under gunicorn (``ratewarden.bench.wsgi_live``):
each of ``LIVE_VARIANTS`` built from ``wsgi_apps`` for one limit and store, counting its answers by
status in a file per worker (``Counted``, summed by ``read_counts``); gunicorn loads
``gunicorn 'ratewarden.bench.wsgi_live_apps:gunicorn_app("flask-limiter", "allow")'``."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ArgumentError
from .wsgi_apps import (
    ALLOW,
    KEY_HEADER,
    PATH,
    Floor429,
    WSGIApp,
    django_bare,
    django_handler,
    django_ratelimit_app,
    flask_bare,
    flask_limiter_app,
    rw_flask,
    rw_limiter,
    rw_wsgi_flask,
    use_django_cache,
)

__all__ = ["COUNT_SLOTS", "LIVE_VARIANTS", "Counted", "gunicorn_app", "live_app", "read_counts"]

#: The apps ``gunicorn_app`` serves (the live rows of ``ratewarden.bench.wsgi_live``).
LIVE_VARIANTS = ("flask bare", "django bare", "floor: fixed 429", "flask-limiter", "ratewarden.flask",
                 "ratewarden.wsgi", "django-ratelimit", "ratewarden.django")
#: ratewarden's Redis check timeout in the live rows: with several servers' workers on few cores (and
#: fail-closed checks), the default would time the scheduler, as the ASGI multi-worker rows found.
LIVE_REDIS_TIMEOUT = 1.0
#: What each worker counts by the status of its answers (``Counted``), in this order.
COUNT_SLOTS = ("2xx", "429", "403", "other")


class Counted:
    """``app`` counting its answers by status (``COUNT_SLOTS``) in a small file of the directory
    ``directory`` named after the worker's pid (memory-mapped: a count costs no system call). The
    harness sums the files: the admitted count of every worker, answers wrk never read included."""

    def __init__(self, app: WSGIApp, directory: str) -> None:
        import threading

        self.app, self.directory = app, directory
        self._lock = threading.Lock()  # gthread workers answer from several threads
        self._pid = 0
        self._map: Any = None
        self._open()

    def _open(self) -> None:
        import mmap

        path = os.path.join(self.directory, str(os.getpid()))
        with open(path, "a+b") as f:
            f.truncate(8 * len(COUNT_SLOTS))
            self._map = mmap.mmap(f.fileno(), 8 * len(COUNT_SLOTS))
        self._pid = os.getpid()

    def _bump(self, status: str) -> None:
        slot = 0 if status[:1] == "2" else {"429": 1, "403": 2}.get(status[:3], 3)
        with self._lock:
            if self._pid != os.getpid():  # forked after the app was built (--preload)
                self._open()
            at = 8 * slot
            self._map[at:at + 8] = (int.from_bytes(self._map[at:at + 8], "little") + 1).to_bytes(8, "little")

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            self._bump(status)
            return start_response(status, headers, exc_info)

        return self.app(environ, start)


def read_counts(directory: str) -> tuple[int, dict[str, int]]:
    """(workers that have counted, their answers summed by ``COUNT_SLOTS``) from ``Counted``'s files."""
    total = dict.fromkeys(COUNT_SLOTS, 0)
    files = 0
    for name in os.listdir(directory):
        try:
            with open(os.path.join(directory, name), "rb") as f:
                raw = f.read(8 * len(COUNT_SLOTS))
        except OSError:
            continue
        if len(raw) < 8 * len(COUNT_SLOTS):
            continue
        files += 1
        for i, slot in enumerate(COUNT_SLOTS):
            total[slot] += int.from_bytes(raw[8 * i:8 * i + 8], "little")
    return files, total


def _rw_django_mw_live(limit: int, store: str, url: str, per: str, key: str) -> tuple[WSGIApp, str]:
    """Django + ``ratewarden.django.RateLimitMiddleware`` with one ``settings.RATEWARDEN`` rule on
    ``PATH`` (a gunicorn worker serves this one app)."""
    from django.conf import settings  # type: ignore[import-untyped]
    from django.test.signals import setting_changed  # type: ignore[import-untyped]

    import ratewarden.django  # noqa: F401 - fails here, not in the middleware chain, if it does not import

    django_bare(url if store == "redis" else "")
    rule: dict[str, Any] = {"path": PATH, "rate": f"{limit}/{per}"}
    if key == "header":
        rule["key"] = f"header:{KEY_HEADER}"
    value = {"STORE": rw_limiter(store, url, LIVE_REDIS_TIMEOUT).store, "ON_ERROR": "closed", "RULES": [rule]}
    settings.RATEWARDEN = value
    setting_changed.send(sender=None, setting="RATEWARDEN", value=value, enter=True)
    return django_handler(["ratewarden.django.RateLimitMiddleware"]), PATH


def live_app(variant: str, limit: int, store: str, url: str = "", *, per: str = "hour",
             key: str = "ip") -> tuple[WSGIApp, str]:
    """One of ``LIVE_VARIANTS`` limited to ``limit`` per ``per`` on ``store``: ratewarden on ``memory``,
    ``shm`` (``url``: its ``shm://`` URL) or ``redis``; the peers on their per-process memory (flask-limiter
    ``memory://``, django-ratelimit ``LocMemCache``) unless ``store`` is ``redis`` (``url``)."""
    redis_url = url if store == "redis" else ""
    if variant == "flask bare":
        return flask_bare(), PATH
    if variant == "floor: fixed 429":
        return Floor429(flask_bare()), PATH
    if variant == "django bare":
        return django_bare(redis_url)
    if variant == "flask-limiter":
        return flask_limiter_app(limit, redis_url or "memory://", per=per, key=key), PATH
    if variant == "ratewarden.flask":
        return rw_flask(limit, store, url, per=per, key=key, timeout=LIVE_REDIS_TIMEOUT), PATH
    if variant == "ratewarden.wsgi":
        return rw_wsgi_flask(limit, store, url, per=per, key=key, timeout=LIVE_REDIS_TIMEOUT), PATH
    if variant == "django-ratelimit":
        app = django_ratelimit_app(limit, redis_url, per=per, key=key)
        use_django_cache("redis" if redis_url else "default")
        return app
    if variant == "ratewarden.django":
        return _rw_django_mw_live(limit, store, url, per, key)
    raise ArgumentError(f"unknown variant {variant!r}; choose from {', '.join(LIVE_VARIANTS)}")


def gunicorn_app(variant: str, mode: str = "allow", store: str = "memory") -> WSGIApp:
    """An app of ``LIVE_VARIANTS`` for gunicorn (``ratewarden.bench.wsgi_live_apps:gunicorn_app("flask-limiter",
    "limit", "memory")``), every request sent to its limited route: ``mode`` is ``allow`` (a limit never
    reached) or ``limit`` (``RW_BENCH_LIMIT`` per ``RW_BENCH_PER``, default 100 per hour). From the
    environment: the store's URL (``RW_BENCH_STORE_URL``: Redis or ``shm://``), the key (``RW_BENCH_KEY``:
    ``ip`` or ``header``) and the directory of the answer counts (``RW_BENCH_COUNTS``, ``Counted``)."""
    limit = ALLOW if mode == "allow" else int(os.environ.get("RW_BENCH_LIMIT", "100"))
    app, path = live_app(variant, limit, store, os.environ.get("RW_BENCH_STORE_URL", ""),
                         per=os.environ.get("RW_BENCH_PER", "hour"), key=os.environ.get("RW_BENCH_KEY", "ip"))
    if path != PATH:
        inner = app

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            environ["PATH_INFO"] = path
            return inner(environ, start_response)

    counts = os.environ.get("RW_BENCH_COUNTS", "")
    return Counted(app, counts) if counts else app
