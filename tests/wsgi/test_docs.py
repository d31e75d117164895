"""docs/wsgi.md: its Python examples run as written."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "wsgi.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_the_page_has_examples() -> None:
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / f"wsgi_{index}.py"
    script.write_text(BLOCKS[index])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "[200, 200, 200, 429]" in out and "{'remaining': 2}" in out and "Too Many Requests" in out
