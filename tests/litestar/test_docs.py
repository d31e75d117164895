"""docs/litestar.md: its Python examples run as written and do what the page says, and
docs/architecture.md's walk through the Litestar door states its size as the script counts it."""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "litestar.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def example(index: int, tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / f"litestar_{index}.py"
    script.write_text(BLOCKS[index])
    return runpy.run_path(str(script), run_name="docs_example")  # not __main__: uvicorn.run would serve


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, tmp_path: Path) -> None:
    assert "app" in example(index, tmp_path)


def client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=("10.0.0.1", 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


async def test_the_first_examples_app_limits_as_the_page_says(tmp_path: Path) -> None:
    app = example(0, tmp_path)["app"]
    async with client(app) as http:
        orders = [await http.post("/api/orders", headers={"X-API-Key": "k1"}) for _ in range(4)]
        other_key = await http.post("/api/orders", headers={"X-API-Key": "k2"})
        items = await http.get("/api/items")
        missing = await http.get("/api/missing")
        reports = [await http.get("/api/report") for _ in range(6)]
    assert [r.status_code for r in orders] == [201, 201, 201, 429]
    refused = orders[-1]
    shown = ("content-type", "ratelimit-policy", "ratelimit", "retry-after")
    assert [name for name, _ in refused.headers.items() if name in shown] == list(shown)  # in the page's order
    assert refused.headers["ratelimit-policy"] == '"api";q=100;w=60, "orders";q=3;w=60'
    assert re.fullmatch(r'"orders";r=0;t=\d+', refused.headers["ratelimit"])
    body = json.loads(refused.content)
    assert (body["policy"], body["limit"], body["title"]) == ("orders", 3, "Too Many Requests")
    assert other_key.status_code == 201
    # 4 orders served and this request, of 100: the refused order charged nothing (all or nothing).
    assert (items.status_code, items.json()) == (200, {"remaining": 95})
    assert missing.status_code == 404 and "ratelimit" not in missing.headers  # routed requests only
    assert [r.status_code for r in reports] == [200] * 5 + [429]
    assert reports[0].headers["ratelimit-policy"] == '"api";q=100;w=60, "5/minute";q=5;w=60'


async def test_the_wrapped_app_counts_what_no_route_answers(tmp_path: Path) -> None:
    app = example(1, tmp_path)["app"]
    async with client(app) as http:
        missing = await http.get("/api/missing")
        items = await http.get("/api/items")
    assert missing.status_code == 404 and missing.headers["x-ratelimit-remaining"] == "99"
    assert items.status_code == 200 and items.headers["x-ratelimit-remaining"] == "98"


def test_architecture_states_the_doors_size_as_the_script_counts_it() -> None:
    out = subprocess.run([sys.executable, "scripts/code_lines.py", "src/ratewarden/litestar.py"], cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    total = int(out.splitlines()[-1].split()[0])
    assert total <= 120
    section = (ROOT / "docs" / "architecture.md").read_text().split("## The Litestar door: translate, core, send", 1)[1]
    assert f"**{total} lines of code**" in section.split("\n## ", 1)[0]
