"""docs/sanic.md: its Python examples run as written, and the first one's app does what the page says."""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from sanic import Sanic

from .server import send, serving

DOC = Path(__file__).resolve().parents[2] / "docs" / "sanic.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, tmp_path: Path) -> None:
    Sanic.test_mode = True  # an app name seen before may be used again
    script = tmp_path / f"sanic_{index}.py"
    script.write_text(BLOCKS[index])
    runpy.run_path(str(script), run_name="docs_example")  # not __main__: app.run() would serve forever


async def test_the_first_examples_app_limits_orders_per_key(tmp_path: Path) -> None:
    Sanic.test_mode = True
    script = tmp_path / "sanic_app.py"
    script.write_text(BLOCKS[0])
    app = runpy.run_path(str(script), run_name="docs_example")["app"]
    async with serving(app) as port:
        orders = [await send(port, "POST", "/api/orders", {"X-API-Key": "k1"}) for _ in range(4)]
        other_key = await send(port, "POST", "/api/orders", {"X-API-Key": "k2"})
        items = await send(port, "GET", "/api/items")
    assert [status for status, _, _ in orders] == [201, 201, 201, 429]
    refused = dict(orders[-1][1])
    assert refused["ratelimit-policy"] == f'"api";q=100;w=60, "{app.name}.orders";q=3;w=60'
    assert refused["ratelimit"].startswith(f'"{app.name}.orders";r=0;t=')
    assert json.loads(orders[-1][2])["policy"] == f"{app.name}.orders"
    assert other_key[0] == 201
    # 4 orders served and this request, of 100: the refused order charged nothing (all or nothing)
    assert (items[0], json.loads(items[2])) == (200, {"remaining": 95})


def test_architecture_states_the_doors_size_as_the_script_counts_it() -> None:
    """docs/architecture.md's "A new door, start to finish": its line counts are the script's."""
    root = DOC.parents[1]
    out = subprocess.run([sys.executable, "scripts/code_lines.py", "src/ratewarden/sanic"], cwd=root,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    counts = {Path(path).name: int(n) for n, path in (line.split() for line in out.splitlines())}
    section = (root / "docs" / "architecture.md").read_text().split("## A new door, start to finish", 1)[1]
    section = section.split("\n## ", 1)[0]
    assert f"**{counts.pop('total')} lines of code**" in section
    for module, n in counts.items():
        assert f"| `{module}` | {n} |" in section, module
