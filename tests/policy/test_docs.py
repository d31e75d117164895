"""Every Python example in docs/policies.md and docs/operations.md runs as written (from the repo root)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "docs" / "policies.md", ROOT / "docs" / "operations.md"]
BLOCKS = [
    (doc.name, i, code)
    for doc in DOCS
    for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(), re.S))
]


def test_docs_have_examples() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize(("doc", "index", "code"), BLOCKS, ids=[f"{d}-{i}" for d, i, _ in BLOCKS])
def test_doc_example_runs(doc: str, index: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    script = tmp_path / f"{doc}-{index}.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")


def _complete_example() -> str:
    """The TOML block under "## A complete example" in docs/policies.md, as written."""
    text = (ROOT / "docs" / "policies.md").read_text()
    section = text[text.index("## A complete example"):]
    found = re.search(r"```toml\n(.*?)```", section, re.S)
    assert found, "docs/policies.md: no TOML block under '## A complete example'"
    return found.group(1)


def test_complete_example_passes_ratewarden_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 21: the example was cut short ("# ... standard, anonymous") and failed with "unknown group"."""
    from ratewarden.cli import main

    path = tmp_path / "policy.toml"
    path.write_text(_complete_example())
    status = main(["check", str(path)])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.rstrip().endswith("OK") and "5 rule(s)" in out


def test_complete_example_is_the_example_file() -> None:
    assert _complete_example() == (ROOT / "examples" / "policy.toml").read_text()
