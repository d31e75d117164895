"""The WSGI app the gunicorn tests serve (``tests.wsgi.apps:app``), configured by environment:

* ``RW_STORE``: ``memory`` (the default), ``shm:<name>:<directory>`` (a ``SharedMemoryStore`` every
  worker opens by name) or a store URL for ``open_store`` (``redis://...``, ``memcached://...``);
* ``RW_LIMIT``: requests per hour on ``/limited``, all charged to one key (default 100), or to the
  ``X-Client`` request header's value when there is one;
* ``RW_ON_ERROR``: the limiter's failure policy, ``open`` (the default) or ``closed``;
* ``RW_PREFIX``: the limiter's storage-key prefix (a fresh one per test on a shared server);
* ``RW_PIDS``: a directory where each answer (admitted or not) leaves a file named after its
  worker's pid (which workers took part);
* ``RW_SLEEP``: seconds an admitted request takes (so one worker cannot take them all).

Local stores run on a frozen clock, so the expected count is exact whatever the time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.stores import SharedMemoryStore, open_store
from ratewarden.stores.base import Store
from ratewarden.wsgi import RateLimitMiddleware


def frozen() -> float:
    return 6000.0


def make_store(spec: str) -> Store:
    if spec == "memory":
        return MemoryStore(clock=frozen)
    if spec.startswith("shm:"):
        _, name, directory = spec.split(":", 2)
        return SharedMemoryStore(name, max_keys=1000, directory=directory, clock=frozen)
    return open_store(spec)


PIDS = os.environ.get("RW_PIDS")
SLEEP = float(os.environ.get("RW_SLEEP", "0"))


def limited(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    if SLEEP:
        time.sleep(SLEEP)
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


def client(scope: dict[str, Any]) -> str:
    """Who is charged: the ``X-Client`` header's value, else one key for everyone."""
    for name, value in scope["headers"]:
        if name == b"x-client":
            return value.decode("latin-1")
    return "everyone"


limited_app = RateLimitMiddleware(
    limited,
    Limiter(
        make_store(os.environ.get("RW_STORE", "memory")), prefix=os.environ.get("RW_PREFIX", "rw"),
        on_error=os.environ.get("RW_ON_ERROR", "open"),  # type: ignore[arg-type]
    ),
    [Rule("/limited", f"{os.environ.get('RW_LIMIT', '100')}/hour", key=client, algorithm="sliding_window")],
)


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """``limited_app``, leaving this worker's pid file (``RW_PIDS``) whatever the answer."""
    if PIDS:
        Path(PIDS, str(os.getpid())).touch()
    return limited_app(environ, start_response)
