"""The README's Python examples, and those of the user-guide pages its former sections moved to
(issue 39: a README for users first, the rest in docs/), extracted so tests run them exactly as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: The pages that hold what the README used to: each block of each runs as written (tests/test_readme.py).
GUIDE = tuple(
    DOCS / name
    for name in ("limits.md", "responses.md", "fastapi.md", "integrations.md", "failures.md", "choosing-a-store.md")
)


def _blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.DOTALL)


def python_blocks() -> list[str]:
    """The README's own Python blocks."""
    return _blocks(README)


def guide_blocks() -> list[tuple[str, str]]:
    """``(page name, block)`` for every Python block of the README and of the guide pages, in order."""
    return [(page.name, code) for page in (README, *GUIDE) for code in _blocks(page)]


def section(page: Path, heading: str) -> str:
    """The text under ``## heading`` of ``page``, up to the next level-2 heading."""
    text = page.read_text(encoding="utf-8")
    marker = f"\n## {heading}\n"
    assert marker in text, f"{page.name} has no section {heading!r}"
    return text.split(marker, 1)[1].split("\n## ", 1)[0]


def first_example() -> str:
    """The first Python block of the README (the one the issue asks to work as written)."""
    blocks = python_blocks()
    assert blocks, "README.md has no ```python block"
    return blocks[0]


def run_block(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(code, str(README), "exec"), namespace)
    return namespace
