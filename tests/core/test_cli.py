"""The ``ratewarden`` command line itself (issue 21, item 6): no command is a usage error; the
demo's help says what it does."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ratewarden.cli import COMMANDS, main


def test_no_command_prints_usage_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("usage: ratewarden") and "check" in err and "demo" in err
    assert err.rstrip().endswith("ratewarden: error: a command is required (ratewarden COMMAND --help for its options)")


def test_no_command_exits_2_from_the_console() -> None:
    result = subprocess.run([sys.executable, "-m", "ratewarden.cli"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.startswith("usage: ratewarden") and result.stdout == ""


def test_help_still_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "usage: ratewarden" in capsys.readouterr().out


def test_demo_help_is_honest(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo sends bursts of requests and prints the results; it asks nothing."""
    assert "interactive" not in COMMANDS["demo"][1]
    assert "bursts" in COMMANDS["demo"][1]
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert "interactive" not in out and "burst" in out and "exit" in out


def test_help_names_asgi_wsgi_and_gateways(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "ASGI and WSGI apps (FastAPI, Starlette, Flask, Django)" in out and "gateways" in out


def test_bench_help_states_each_default_once(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: )" not in out and "(default: None)" not in out and "(default: False)" not in out
    assert "(default: all; --quick: ratewarden,traffik,slowapi,bare)" in out
    assert "--quick: ratewarden,traffik,slowapi,bare) (default" not in out  # not a second default
    assert "(default: bench-results)" in out  # a default the help does not state is still added
    assert "seed" not in out  # no internal words


def test_demo_serves_the_readme_example_and_explains_the_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    """Real HTTP to uvicorn: /api/hello's 100/min (the README's) holds, its 429's t is its
    Retry-After, and the output says what q, w, r and t are."""
    pytest.importorskip("uvicorn")
    assert main(["demo", "--concurrency", "4"]) == 0
    out = capsys.readouterr().out
    api = out.split("GET /api/hello", 1)[1].split("GET /items", 1)[0]
    assert "(100/min per client IP, middleware rule, sliding_window): 110 requests" in api
    allowed = int(api.split("allowed ", 1)[1].split(",", 1)[0])
    assert 100 <= allowed <= 102  # a burst across a minute boundary may see one unit fade
    assert 'RateLimit-Policy: "/api/**";q=100;w=60' in api
    t = api.split(";t=", 1)[1].split()[0]
    assert f"Retry-After: {t}" in api  # on a 429, t is when a request fits again
    assert "GET /items  (10/s per client IP, route dependency, fixed_window): 20 requests" in out
    assert "q is the limit and w its window in seconds" in out and "t the" in out
