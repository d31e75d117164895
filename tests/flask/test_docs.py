"""docs/flask.md: its Python examples run as written (the migration example among them)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "flask.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_the_page_has_examples() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"flask_{index}.py"
    script.write_text(BLOCKS[index])
    runpy.run_path(str(script), run_name="docs_example")


def test_the_migration_example_keeps_flask_limiters_answers() -> None:
    """The example under "Migrating from flask-limiter" is the one that shows its three options."""
    section = DOC.read_text().split("## Migrating from flask-limiter", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)[0]
    assert 'RATEWARDEN_HEADER_RESET="epoch"' in code and 'RATEWARDEN_ALGORITHM="sliding_log"' in code
    assert "e.description" in code
