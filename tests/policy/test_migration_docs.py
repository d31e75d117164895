"""docs/migration-slowapi.md: its example runs as written, and what it says slowapi does is what
slowapi does (where slowapi is installed): ``sliding_log`` gives a burst slowapi's ``Retry-After``,
and slowapi counts each URL apart, as the page's per-URL key does."""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response  # at module level: the annotations below are strings
from fastapi.testclient import TestClient

DOC = Path(__file__).resolve().parents[2] / "docs" / "migration-slowapi.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_the_page_has_an_example() -> None:
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"slowapi_{index}.py"
    script.write_text(BLOCKS[index])
    runpy.run_path(str(script), run_name="docs_example")


def _slowapi_app() -> Any:
    slowapi = pytest.importorskip("slowapi")
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address

    limiter = slowapi.Limiter(key_func=get_remote_address, headers_enabled=True)
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, slowapi._rate_limit_exceeded_handler)

    @app.get("/items/{item_id}")
    @limiter.limit("5/minute")
    async def item(request: Request, response: Response, item_id: int) -> dict[str, int]:
        return {"id": item_id}

    return app


def test_the_example_answers_as_slowapi_did(tmp_path: Path) -> None:
    theirs = TestClient(_slowapi_app())
    script = tmp_path / "ours.py"
    script.write_text(BLOCKS[0])
    ours = TestClient(runpy.run_path(str(script), run_name="docs_example")["app"])
    them = [theirs.get("/items/1") for _ in range(6)]
    assert [r.status_code for r in them] == [200] * 5 + [429]
    assert them[5].json() == {"error": "Rate limit exceeded: 5 per 1 minute"}
    assert abs(int(them[5].headers["retry-after"]) - 60) <= 1  # counted from the first hit
    assert theirs.get("/items/2").status_code == 200  # each URL its own count
    # The page's app has used /items/1 up (6 requests) and /items/2 once: a new client's URL is fresh.
    us = [ours.get("/items/3") for _ in range(6)]
    assert [r.status_code for r in us] == [200] * 5 + [429]
    assert abs(int(us[5].headers["retry-after"]) - int(them[5].headers["retry-after"])) <= 1
