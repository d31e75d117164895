"""RateLimiter under a real gunicorn over loopback (``tests/flask/gunicorn_app.py``): 150 concurrent
requests against a limit of 100 admit exactly 100, for every server shape (1 sync worker, one
``gthread`` worker with 8 threads, 4 sync workers) on every store that shape can share (memory for
one process, shared memory for several, Redis and Memcached for all). The 4-worker shared-memory row
is the README's "deploy with gunicorn -w 4" configuration, taken from the page itself (docs/integrations.md since
issue 39)."""

from __future__ import annotations

import importlib.util
import re
import sys
import uuid
from pathlib import Path

import pytest

from ratewarden.stores.shared_memory.segment import segment_path
from tests.readme import DOCS
from tests.readme import section as guide_section
from tests.servers import (
    GUNICORN_ROWS,
    Memcached,
    RedisStandalone,
    gunicorn_exactly_100,
)
from tests.shm import unique_name

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gunicorn") is None, reason="gunicorn is not installed")

APP = "tests.flask.gunicorn_app:app"

SYNC, GTHREAD, FOUR = GUNICORN_ROWS


def exactly_100(server: tuple[int, int, str], env: dict[str, str], tmp_path: Path) -> None:
    gunicorn_exactly_100(APP, "/limited", server, env, tmp_path)


@pytest.mark.parametrize("server", [SYNC, GTHREAD])
def test_memory_store(server: tuple[int, int, str], tmp_path: Path) -> None:
    exactly_100(server, {"RATEWARDEN_STORAGE_URL": "memory://"}, tmp_path)


@pytest.mark.parametrize("server", [SYNC, GTHREAD, FOUR])
def test_redis_store(server: tuple[int, int, str], redis_standalone: RedisStandalone, tmp_path: Path) -> None:
    # A timeout no busy machine reaches: a check the store fails is counted per worker, not exactly.
    env = {"RATEWARDEN_STORAGE_URL": f"{redis_standalone.url}?timeout=5", "RATEWARDEN_KEY_PREFIX": f"fl-{uuid.uuid4().hex[:12]}"}
    exactly_100(server, env, tmp_path)


@pytest.mark.parametrize("server", [SYNC, GTHREAD, FOUR])
def test_memcached_store(server: tuple[int, int, str], memcached_server: Memcached, tmp_path: Path) -> None:
    env = {"RATEWARDEN_STORAGE_URL": f"{memcached_server.url}?timeout=5", "RATEWARDEN_KEY_PREFIX": f"fl-{uuid.uuid4().hex[:12]}"}
    exactly_100(server, env, tmp_path)


def readme_deploy() -> tuple[str, str]:
    """The Flask section's (the README's until issue 39, docs/integrations.md now) "deploy with gunicorn -w 4": its store URL and its table's name."""
    section = guide_section(DOCS / "integrations.md", "Flask")  # the README's section, in docs/ since issue 39
    assert "gunicorn -w 4 myapp:app" in section
    url = re.findall(r'RATEWARDEN_STORAGE_URL="(shm://[^"]+)"', section)
    assert len(url) == 1, url
    return url[0], re.match(r"shm://([^?/]+)", url[0]).group(1)  # type: ignore[union-attr]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SharedMemoryStore across workers: Linux")
def test_readme_deploy_four_workers_share_the_shared_memory_store(tmp_path: Path) -> None:
    """``gunicorn -w 4`` with the README's ``RATEWARDEN_STORAGE_URL`` (a fresh table name, in the
    same default directory, with the same options)."""
    url, name = readme_deploy()
    fresh = unique_name("flask")
    try:
        exactly_100((4, 1, "sync"), {"RATEWARDEN_STORAGE_URL": url.replace(f"shm://{name}", f"shm://{fresh}")}, tmp_path)
    finally:
        segment_path(fresh).unlink(missing_ok=True)
