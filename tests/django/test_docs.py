"""docs/django.md: every Python example runs as written, each in a fresh interpreter (an example
configures Django itself, or is a ``settings.py`` whose ``RATEWARDEN`` must pass ``manage.py check``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "django.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)

# Run after a settings.py example: Django configured with its upper-case names, then the checks
# `manage.py check` runs (ratewarden.E001/E002), without opening the store.
SETTINGS_CHECK = """
import django
from django.conf import settings as _settings
from ratewarden.django.config import check_config

check_config(RATEWARDEN)
_settings.configure(**{name: value for name, value in dict(globals()).items() if name.isupper()})
django.setup()
from django.core import checks

import ratewarden.django  # noqa: F401  (registers the check, as INSTALLED_APPS does)
errors = checks.run_checks()
assert not errors, errors
"""


def test_every_example_is_python() -> None:
    """Issue 39: the page's examples were plain-text fences, so none was run."""
    assert len(BLOCKS) >= 5
    text = DOC.read_text()
    assert "```text\nRATEWARDEN" not in text and "```text\nfrom" not in text and "```text\ndef" not in text


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, tmp_path: Path) -> None:
    code = BLOCKS[index]
    if "settings.configure(" not in code:
        assert "RATEWARDEN = {" in code, "an example that configures nothing is a settings.py"
        code += SETTINGS_CHECK
    script = tmp_path / f"django_{index}.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"docs/django.md example {index}:\n{done.stderr[-3000:]}"
