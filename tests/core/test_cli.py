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
