"""Fixtures of the store tests."""

from __future__ import annotations

import pytest

from tests.shm import LOCK_KINDS


@pytest.fixture(params=LOCK_KINDS)
def lock(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each region lock of the shared-memory store: robust mutexes and fcntl locks; where the C
    helpers are built, the mutexes run through them ("mutex") and through their ``ctypes``
    fallback ("mutex-ctypes", for this process and the ones it starts). Each has its own one-key
    hot path."""
    if request.param == "mutex-ctypes":
        monkeypatch.setenv("RATEWARDEN_SHM_NATIVE", "0")
        return "mutex"
    return str(request.param)
