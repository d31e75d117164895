"""``from ratewarden import PolicyMiddleware`` works, without ``import ratewarden`` loading the policy package."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_policy_middleware_is_exported_lazily() -> None:
    code = (
        "import sys, ratewarden\n"
        "assert 'ratewarden.policy' not in sys.modules, 'policy package loaded eagerly'\n"
        "from ratewarden import PolicyMiddleware\n"
        "from ratewarden.policy import PolicyMiddleware as direct\n"
        "assert PolicyMiddleware is direct\n"
        "assert 'PolicyMiddleware' in ratewarden.__all__\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_unknown_attribute_still_raises() -> None:
    import ratewarden

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        ratewarden.Nope  # type: ignore[attr-defined]  # noqa: B018
