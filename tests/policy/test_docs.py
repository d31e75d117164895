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
TOML_BLOCK = re.findall(r"```toml\n(.*?)```", (ROOT / "docs" / "policies.md").read_text(), re.S)


def test_docs_have_examples() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize(("doc", "index", "code"), BLOCKS, ids=[f"{d}-{i}" for d, i, _ in BLOCKS])
def test_doc_example_runs(doc: str, index: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    script = tmp_path / f"{doc}-{index}.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")


def test_docs_toml_excerpt_is_valid() -> None:
    from ratewarden.policy import parse_policy

    text = TOML_BLOCK[0].replace("# ... standard, anonymous", '[groups.standard]\nlimits = "1/s"\n[groups.anonymous]\nlimits = "1/s"')
    policy = parse_policy(text)
    assert [r.name for r in policy.rules] == ["/health", "api", "login"]
