"""Whether the compiled front door (``ratewarden._front``) is here to be tested: its tests skip, with
the reason, only where it could not have been built; where cargo is on PATH or the build recorded
that it compiled it, a missing extension fails them loudly."""

from __future__ import annotations

import shutil
import socket

import pytest

from ratewarden.serve.front import build_record, compiled_module


def require_compiled_front() -> None:
    """Return when ``ratewarden._front`` imports; else fail (it should have been built) or skip."""
    module, why = compiled_module()
    if module is not None:
        return
    record = build_record()
    cargo = shutil.which("cargo")
    if record == "compiled" or cargo is not None:
        pytest.fail(
            f"the compiled front door is missing though it should have been built (cargo: {cargo}; "
            f"build record: {record}): {why}. Build it: pip install -e . (or make setup)"
        )
    pytest.skip(f"the compiled front door is not built here: {why}")


def loopback_listener(backlog: int = 2048) -> socket.socket:
    """A non-blocking listening socket on a free loopback port, for a compiled door to serve on."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(backlog)
    listener.setblocking(False)
    return listener
