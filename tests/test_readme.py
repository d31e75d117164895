"""The README: every Python example runs as written, and the main ones do what the README says."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tests.core.asgi import request
from tests.readme import first_example, python_blocks, run_block
from tests.vectors.runner import FakeClock

BLOCKS = python_blocks()


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index])
    runpy.run_path(str(script), run_name="__main__")


ISSUE_EXAMPLE = '''
from fastapi import Depends, FastAPI
from ratewarden import Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.fastapi import RateLimit
from ratewarden.keys import client_ip

limiter = Limiter(MemoryStore())
app = FastAPI()
app.add_middleware(RateLimitMiddleware, limiter=limiter,
                   rules=[Rule("/api/**", "100/min", key=client_ip, algorithm="sliding_window")])

@app.get("/items", dependencies=[Depends(RateLimit("10/s", limiter=limiter))])
async def items() -> dict[str, bool]:
    return {"ok": True}
'''


def _normalise(code: str) -> str:
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def test_readme_first_example_is_the_issue_example() -> None:
    assert _normalise(first_example()) == _normalise(ISSUE_EXAMPLE)


@pytest.mark.parametrize("source", ["readme", "issue"])
async def test_first_example_runs_as_written(source: str) -> None:
    ns = run_block(first_example() if source == "readme" else ISSUE_EXAMPLE)
    app, limiter = ns["app"], ns["limiter"]
    limiter.store.clock = FakeClock(6000.0)  # freeze time so the counts are exact
    items = [await request(app, "/items") for _ in range(12)]
    assert [r.status for r in items] == [200] * 10 + [429, 429]
    assert items[0].json() == {"ok": True}
    assert items[0].header("x-ratelimit-limit") == "10"
    assert items[9].header("x-ratelimit-remaining") == "0"
    assert items[10].header("retry-after") == "1"
    # The middleware rule: 100/min on /api/** per client IP (no route there, so 404 until limited).
    api = [(await request(app, "/api/anything")).status for _ in range(101)]
    assert api == [404] * 100 + [429]
    assert (await request(app, "/api/anything", client=("198.51.100.99", 1))).status == 404


def test_rates_and_limiter_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = python_blocks()
    rates = next(b for b in blocks if "parse_rate(" in b)
    run_block(rates)
    assert "fortnight" in capsys.readouterr().out
    limiter_block = next(b for b in blocks if "limiter.hit(" in b and "asyncio.run" in b)
    run_block(limiter_block)
    lines = capsys.readouterr().out.split("\n")
    assert lines[0].startswith("True 1") and lines[1].startswith("True 0") and lines[2].startswith("False 0")
    assert lines[3] == "True"


def test_decorator_and_websocket_example_runs() -> None:
    block = next(b for b in python_blocks() if "@limit(" in b)
    ns = run_block(block)
    ns["limiter"].store.clock = FakeClock(6000.0)
    with TestClient(ns["app"]) as client:
        codes = [client.get("/report").status_code for _ in range(6)]
        assert codes == [200] * 5 + [429]
        with client.websocket_connect("/ws") as ws:
            for i in range(5):
                ws.send_text(str(i))
                assert ws.receive_text() == str(i)
            ws.send_text("sixth")
            assert json.loads(ws.receive_text())["type"] == "rate_limit"
