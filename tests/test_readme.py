"""Every Python example in the README runs as written."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index])
    runpy.run_path(str(script), run_name="__main__")


def test_readme_first_example_limits() -> None:
    from starlette.testclient import TestClient

    namespace = runpy.run_path(_write(BLOCKS[0]))
    client = TestClient(namespace["app"])
    statuses = [client.get("/items").status_code for _ in range(12)]
    assert statuses.count(200) <= 10 and statuses.count(429) >= 2
    assert "ratelimit" in client.get("/api/anything").headers


def _write(code: str) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(code)
    return handle.name
