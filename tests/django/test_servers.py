"""Exactness under real servers: 150 concurrent requests against a limit of 100 admit exactly 100,
under gunicorn (gthread, 8 threads, MemoryStore; 2 workers sharing a SharedMemoryStore) and for an
async view under uvicorn."""

from __future__ import annotations

import importlib.util
import sys
import time

import pytest

from tests.servers import gunicorn_server, http_burst, uvicorn_in_thread
from tests.shm import SHM_DIR, unique_name

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gunicorn") is None, reason="gunicorn is not installed")


def test_gunicorn_gthread_memory_store() -> None:
    started = time.monotonic()
    with gunicorn_server("tests.django.server_app:application", threads=8, worker_class="gthread",
                         env={"RW_DJANGO_STORE": "memory://"}) as port:
        statuses = http_burst(port, "/burst", 150)
    assert sorted(set(statuses)) == [200, 429]
    assert statuses.count(200) == 100 and statuses.count(429) == 50
    assert time.monotonic() - started < 15


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SharedMemoryStore across workers: Linux")
def test_gunicorn_two_workers_share_a_shared_memory_store() -> None:
    started = time.monotonic()
    url = f"shm://{unique_name('dj')}?max_keys=1000&directory={SHM_DIR}"
    with gunicorn_server("tests.django.server_app:application", workers=2, env={"RW_DJANGO_STORE": url}) as port:
        statuses = http_burst(port, "/burst", 150)
    assert statuses.count(200) == 100 and statuses.count(429) == 50
    assert time.monotonic() - started < 15


def test_async_view_under_uvicorn() -> None:
    from django.core.asgi import get_asgi_application

    started = time.monotonic()
    with uvicorn_in_thread(get_asgi_application()) as port:
        statuses = http_burst(port, "/burst", 150)
    assert statuses.count(200) == 100 and statuses.count(429) == 50
    assert time.monotonic() - started < 15
