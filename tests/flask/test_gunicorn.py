"""RateLimiter under gunicorn: 150 concurrent requests against a limit of 100 admit exactly 100,
with 8 threads in one worker (MemoryStore) and with 2 workers sharing a SharedMemoryStore."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from tests.servers import gunicorn_server, http_burst
from tests.shm import unique_name

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gunicorn") is None, reason="gunicorn is not installed")

APP = "tests.flask.gunicorn_app:app"


def test_gthread_8_threads_memory_store_admit_exactly_100() -> None:
    started = time.monotonic()
    with gunicorn_server(APP, threads=8, worker_class="gthread", env={"RATEWARDEN_STORAGE_URL": "memory://"}) as port:
        codes = http_burst(port, "/limited", 150, concurrency=150)
    assert sorted(set(codes)) == [200, 429]
    assert codes.count(200) == 100
    assert time.monotonic() - started < 15


def test_two_workers_sharing_shared_memory_admit_exactly_100(tmp_path: Path) -> None:
    started = time.monotonic()
    url = f"shm://{unique_name()}?max_keys=1000&directory={tmp_path}"
    with gunicorn_server(APP, workers=2, threads=4, worker_class="gthread", env={"RATEWARDEN_STORAGE_URL": url}) as port:
        time.sleep(1.0)  # the socket is shared: let both workers import the app before the burst
        codes = http_burst(port, "/limited", 150, concurrency=150)
    assert codes.count(200) == 100, f"{codes.count(200)} admitted of 150 against 100"
    assert codes.count(429) == 50
    assert time.monotonic() - started < 15
