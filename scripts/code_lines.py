"""Count the code lines of Python files or packages: lines that are not blank, not a comment and not
part of a docstring (a module's, class's or function's, or a string statement documenting an
attribute). docs/architecture.md measures a door with it.

    python3 scripts/code_lines.py src/ratewarden/sanic [more paths...]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def code_lines(path: Path) -> int:
    """The code lines of one file."""
    text = path.read_text(encoding="utf-8")
    docs: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            docs.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return sum(
        1 for number, line in enumerate(text.splitlines(), 1)
        if number not in docs and line.strip() and not line.strip().startswith("#")
    )


def main(paths: list[str]) -> None:
    total = 0
    for given in paths:
        root = Path(given)
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            count = code_lines(path)
            total += count
            print(f"{count:5d}  {path}")
    print(f"{total:5d}  total")


if __name__ == "__main__":
    main(sys.argv[1:] or ["src/ratewarden/sanic"])
