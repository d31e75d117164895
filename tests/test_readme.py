"""The README: a page for users first (issue 39), every Python example of it and of the guide pages its
former sections moved to runs as written, and the main ones do what the pages say."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from tests.core.asgi import request
from tests.readme import DOCS, GUIDE, README, ROOT, first_example, guide_blocks, python_blocks, run_block
from tests.vectors.runner import FakeClock

BLOCKS = guide_blocks()


def blocks() -> list[str]:
    return [code for _, code in BLOCKS]


def test_readme_has_examples() -> None:
    assert len(python_blocks()) >= 1
    assert len(BLOCKS) >= 16  # the README's 16 examples before issue 39, none lost in the move


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"{page}-{i}" for i, (page, _) in enumerate(BLOCKS)])
def test_readme_example_runs(index: int, tmp_path: Path) -> None:
    script = tmp_path / f"readme_{index}.py"
    script.write_text(BLOCKS[index][1])
    runpy.run_path(str(script), run_name="__main__")


@pytest.mark.parametrize("source", ["readme", "demo"])
async def test_first_example_runs_as_written(source: str) -> None:
    """The README's first example, and ``ratewarden demo``'s app, which says it serves it: both
    doors answer 429 as problem+json, and the path rule limits a route that exists."""
    if source == "readme":
        ns = run_block(first_example())
        app, limiter = ns["app"], ns["limiter"]
    else:
        from ratewarden.cli.demo import build_app

        app = build_app()
        limiter = next(m.kwargs["limiter"] for m in app.user_middleware if "limiter" in m.kwargs)
    limiter.store.clock = FakeClock(6000.0)  # freeze time so the counts are exact
    items = [await request(app, "/items") for _ in range(12)]
    assert [r.status for r in items] == [200] * 10 + [429, 429]
    assert items[0].json() == {"ok": True}
    assert items[0].header("x-ratelimit-limit") == "10"
    assert items[9].header("x-ratelimit-remaining") == "0"
    assert items[10].header("retry-after") == "1"
    assert items[10].header("content-type") == "application/problem+json"  # not FastAPI's {"detail": ...}
    assert items[10].json()["status"] == 429
    # The middleware rule: 100/min on /api/** per client IP, on a route that answers.
    api = [await request(app, "/api/hello") for _ in range(101)]
    assert [r.status for r in api] == [200] * 100 + [429]
    assert api[0].json() == {"hello": "world"}
    assert api[100].header("content-type") == "application/problem+json"
    assert api[0].header("ratelimit") == '"/api/**";r=99;t=60'
    assert (await request(app, "/api/hello", client=("198.51.100.99", 1))).status == 200


def test_demo_drives_the_first_examples_limits() -> None:
    from ratewarden.cli.demo import ENDPOINTS

    code = first_example()
    for path, limit, described in ENDPOINTS:
        assert f'"{path}"' in code or path.startswith("/api/")
        assert f"{limit}/" in code and described.split(" per ")[0] in code


def test_rates_and_limiter_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    rates = next(b for b in blocks() if "parse_rate(" in b)
    run_block(rates)
    assert "fortnight" in capsys.readouterr().out
    limiter_block = next(b for b in blocks() if "limiter.hit(" in b and "asyncio.run" in b)
    run_block(limiter_block)
    lines = capsys.readouterr().out.split("\n")
    assert lines[0].startswith("True 1") and lines[1].startswith("True 0") and lines[2].startswith("False 0")
    assert lines[3] == "True"


def test_decorator_and_websocket_example_runs() -> None:
    block = next(b for b in blocks() if "@limit(" in b and "WebSocketRoute" in b)
    ns = run_block(block)
    ns["limiter"].store.clock = FakeClock(6000.0)
    with TestClient(ns["app"]) as client:
        codes = [client.get("/report").status_code for _ in range(6)]
        assert codes == [200] * 5 + [429]
        with client.websocket_connect("/ws") as ws:
            for i in range(5):
                ws.send_text(str(i))
                assert ws.receive_text() == str(i)
            ws.send_text("sixth")
            assert json.loads(ws.receive_text())["type"] == "rate_limit"


def test_wsgi_example_answers_off_its_route(capsys: pytest.CaptureFixture[str]) -> None:
    """The plain WSGI example's app reads the context only where a rule applied: no 500 off /api/**."""
    block = next(b for b in blocks() if "from ratewarden.wsgi import RateLimitMiddleware" in b)
    ns = run_block(block)
    assert capsys.readouterr().out.splitlines()[-1] == "('200 OK', b'hello, no limit')"
    status, headers, body = ns["get"]("/other/deeper")
    assert (status, body) == ("200 OK", b"hello, no limit") and "retry-after" not in headers


def test_install_line_names_every_extra_and_the_description_every_door() -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the policy extra's tomli
        import tomli as tomllib  # type: ignore[no-redef]

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = README.read_text()
    install = " ".join(text.split("Install: `pip install ratewarden`", 1)[1].split("\n\n", 1)[0].split())
    for extra in project["optional-dependencies"]:
        if extra != "dev":
            assert f"`{extra}`" in install, extra
    assert any("gunicorn" in dep for dep in project["optional-dependencies"]["wsgi"])
    intro = " ".join(text.split("\n## ", 1)[0].split())  # what it is, before any section
    for door in ("ASGI", "WSGI", "Flask", "Django", "FastAPI", "gateways"):
        assert door in intro and door.lower() in project["description"].lower(), door


# -- issue 39: a README for users first ------------------------------------------------------------------

#: Words only the project knew: the README uses none of them, and the glossary defines each once.
INTERNAL_WORDS = {
    "door": "Door",
    "front door": "Front door",
    "edge": "Edge enforcement",
    "floor": "Floor",
    "flood row": "Flood scenario",
    "insurance limiter": "Insurance limiter",
}


def _headings(text: str) -> list[str]:
    return re.findall(r"(?m)^## (.+)$", text)


def test_readme_is_short_and_in_a_users_order() -> None:
    """What it is, install, the first example, what to read next; the contributors' commands last."""
    text = README.read_text(encoding="utf-8")
    assert len(text.encode()) <= 8 * 1024, f"README.md is {len(text.encode())} bytes: move the detail to docs/"
    assert _headings(text) == ["Install", "First example", "What to read next", "Working on ratewarden"]
    install = text.index("`pip install ratewarden`")
    assert install < text.index("```python") < text.index("make bench")
    assert text.index("make test") > text.index("## What to read next")


def test_readme_keeps_the_two_set_up_commands() -> None:
    """The set-up is two commands (``.ci/run`` calls the test one), each with one line on what it does."""
    section = README.read_text(encoding="utf-8").split("\n## Working on ratewarden\n", 1)[1]
    commands = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    assert len(commands) == 1, commands
    lines = commands[0].strip().splitlines()
    assert [line.split("#")[0].strip() for line in lines] == ["make bench", "make test"]
    assert all("#" in line for line in lines)  # what each does
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_uses_no_internal_word() -> None:
    text = README.read_text(encoding="utf-8").lower()
    for word in INTERNAL_WORDS:
        assert not re.search(rf"\b{word}s?\b", text), f"README.md says {word!r}: use plain words"


def test_glossary_defines_each_internal_word_once_and_is_linked() -> None:
    glossary = (DOCS / "glossary.md").read_text(encoding="utf-8")
    headings = _headings(glossary)
    for term in INTERNAL_WORDS.values():
        assert headings.count(term) == 1, term
    assert "(docs/glossary.md)" in README.read_text(encoding="utf-8")
    assert "glossary.md" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


def test_readme_links_lead_to_pages_that_exist() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        assert (ROOT / link).is_file(), link
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in GUIDE:
        assert f": {page.name}" in nav, page.name  # the moved sections are in the site's navigation


def test_make_demo_installs_only_what_the_demo_needs() -> None:
    """``make demo`` no longer depends on ``setup`` (Chromium, every extra, the development tools): its own
    venv gets ratewarden with the extras the demo imports, and uvicorn."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"(?m)^demo:(.*)$", makefile)
    assert target and "setup" not in target.group(1) and "VENV)/.installed" not in target.group(1).replace("DEMO_VENV", "")
    rule = makefile.split("$(DEMO_VENV)/.installed:", 1)[1].split("\n\n", 1)[0]
    assert "'.[fastapi]'" in rule and "uvicorn" in rule
    for heavy in ("--browser", "system-deps", "EXTRAS", "bench", "dev"):
        assert heavy not in rule, heavy
