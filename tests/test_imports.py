"""The import paths the user guide names work as written, and the core never imports FastAPI.

(The README's sections moved to docs/ in issue 39; each check reads the page that now says it.)

- ``from ratewarden.stores import open_store`` (docs/choosing-a-store.md names ``open_store``);
- ``from ratewarden.errors import RateLimitExceeded``: the base of the FastAPI dependency's and the
  Flask extension's errors, so ``ratewarden.errors`` (and the core) imports neither framework;
- the ``test`` extra brings the HTTP client that the guide's ``TestClient`` examples need.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import ratewarden.errors
import ratewarden.fastapi
import ratewarden.flask
import ratewarden.stores
import ratewarden.stores.urls

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
STORES_PAGE = (ROOT / "docs" / "choosing-a-store.md").read_text(encoding="utf-8")
ERRORS_PAGE = (ROOT / "docs" / "responses.md").read_text(encoding="utf-8")
FASTAPI_PAGE = (ROOT / "docs" / "fastapi.md").read_text(encoding="utf-8")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_open_store_is_importable_from_stores() -> None:
    from ratewarden.stores import open_store

    assert open_store is ratewarden.stores.urls.open_store
    assert "open_store" in ratewarden.stores.__all__
    store = open_store("memory://?max_keys=10")
    assert isinstance(store, ratewarden.stores.MemoryStore)
    assert "from ratewarden.stores import open_store" in STORES_PAGE  # where the guide names it


def test_rate_limit_exceeded_is_importable_from_errors() -> None:
    from ratewarden.errors import RateLimitExceeded

    assert issubclass(ratewarden.fastapi.RateLimitExceeded, RateLimitExceeded)
    assert issubclass(ratewarden.flask.RateLimitExceeded, RateLimitExceeded)
    assert issubclass(RateLimitExceeded, ratewarden.errors.RatewardenError)
    assert "RateLimitExceeded" in ratewarden.errors.__all__


def test_errors_module_does_not_import_a_framework() -> None:
    out = _run(
        "import sys\n"
        "sys.modules['fastapi'] = sys.modules['flask'] = None  # as if neither were installed\n"
        "import ratewarden, ratewarden.errors, ratewarden.stores\n"
        "from ratewarden.errors import *\n"
        "from ratewarden.errors import RateLimitExceeded\n"
        "from ratewarden.stores import open_store\n"
        "loaded = sorted(m for m in ('starlette', 'werkzeug', 'ratewarden.fastapi', 'ratewarden.flask') if m in sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    assert out.returncode == 0, out.stderr


def test_readme_says_where_rate_limit_exceeded_lives() -> None:
    assert "from ratewarden.errors import RateLimitExceeded" in ERRORS_PAGE
    assert "ratewarden.fastapi.RateLimitExceeded" in ERRORS_PAGE and "ratewarden.flask.RateLimitExceeded" in ERRORS_PAGE


def _extras() -> dict[str, list[str]]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    extras: dict[str, list[str]] = {}
    for name, body in re.findall(r"^(\w+) = \[(.*?)\]$", section, flags=re.M | re.S):
        extras[name] = re.findall(r'"([^"]+)"', body)
    return extras


def test_test_extra_brings_the_testclient_http_client() -> None:
    """FastAPI's and Starlette's ``TestClient`` need httpx, which the ``fastapi`` extra does not
    bring: the README's TestClient examples (docs/fastapi.md since issue 39) failed on a
    ``pip install 'ratewarden[fastapi]'``."""
    extras = _extras()
    assert "fastapi" in extras and "test" in extras, sorted(extras)
    assert any(re.match(r"httpx\b", requirement) for requirement in extras["test"]), extras["test"]
    # Starlette 1.x's TestClient takes httpx2 when it is there, and warns on every import without it
    # (StarletteDeprecationWarning); httpx2 needs Python 3.11, where FastAPI's own extras bring it.
    assert "httpx2>=2.0; python_version >= '3.11'" in extras["test"], extras["test"]
    assert "pip install 'ratewarden[fastapi,test]'" in FASTAPI_PAGE
    assert "pip install 'ratewarden[fastapi,test]'" in README  # the README's install line says so too
    # Said where the examples are: before the first example of the page that uses TestClient.
    first_testclient = FASTAPI_PAGE.index("from fastapi.testclient import TestClient")
    assert FASTAPI_PAGE.rfind("ratewarden[fastapi,test]", 0, first_testclient) != -1
