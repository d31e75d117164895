"""SIGHUP reloads share the signal: the handler installed before keeps being called, and closing
the middleware puts it back (issue 11, item 12)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from ratewarden import Limiter, MemoryStore
from ratewarden.policy import PolicyMiddleware

from .apps import build_app
from .test_reload import _wait_for, _write


async def test_sighup_chains_the_previous_handler_and_restores_it_on_close(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _write(path, "9/min")
    calls: list[int] = []

    def previous(signum: int, frame: Any) -> None:
        calls.append(signum)

    original = signal.signal(signal.SIGHUP, previous)
    try:
        app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=path, sighup=True)
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            await _wait_for(lambda: app.reloader is not None and app.reloader.reloads >= 1)
            assert calls == [signal.SIGHUP]  # the application's own handler still ran
        finally:
            app.close()
        assert signal.getsignal(signal.SIGHUP) is previous
        os.kill(os.getpid(), signal.SIGHUP)
        await _wait_for(lambda: len(calls) == 2)
        assert app.reloader is not None and app.reloader.reloads == 1  # no reload after close
    finally:
        signal.signal(signal.SIGHUP, original)


async def test_close_leaves_a_handler_installed_later_alone(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _write(path, "9/min")
    original = signal.getsignal(signal.SIGHUP)

    def later(signum: int, frame: Any) -> None:
        pass

    try:
        app = PolicyMiddleware(build_app(), Limiter(MemoryStore()), policy=path, sighup=True)
        signal.signal(signal.SIGHUP, later)  # someone else took the signal after us
        app.close()
        assert signal.getsignal(signal.SIGHUP) is later
    finally:
        signal.signal(signal.SIGHUP, original)
