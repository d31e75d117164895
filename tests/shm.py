"""Factories for ``SharedMemoryStore`` in tests: a private directory, and files unlinked at once
(a mapping outlives its file, so single-process tests leave nothing behind)."""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ratewarden.stores.base import Store
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.shared_memory import SharedMemoryStore

SHM_DIR = Path(tempfile.mkdtemp(prefix="ratewarden-shm-tests-"))
atexit.register(shutil.rmtree, SHM_DIR, True)
KINDS = ["memory", "shm"]
#: Whether the shared-memory store's C helpers are built (a compiled install on Linux).
NATIVE = importlib.util.find_spec("ratewarden.stores.shared_memory._native") is not None
#: The region locks a shared-memory test runs on (the ``lock`` fixture of tests/stores/conftest.py).
LOCK_KINDS = ["mutex", "lockf"] if sys.platform.startswith("linux") else ["lockf"]
if NATIVE:
    LOCK_KINDS.insert(1, "mutex-ctypes")


def unique_name(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def shm_store(max_keys: int | None = None, *, clock: Callable[[], float] | None = None, **options: Any) -> SharedMemoryStore:
    """A fresh private table (its file already unlinked), big enough for the memory-store tests."""
    options.setdefault("log_size", 512)
    if clock is not None:
        options["clock"] = clock
    store = SharedMemoryStore(unique_name(), max_keys=max_keys or 10_000, directory=SHM_DIR, **options)
    store.unlink()
    return store


def local_store(kind: str, max_keys: int | None = None, *, clock: Callable[[], float] | None = None) -> Store:
    """``kind`` is ``"memory"`` or ``"shm"``: the two local stores, which answer identically."""
    if kind == "memory":
        if clock is None:
            return MemoryStore() if max_keys is None else MemoryStore(max_keys)
        return MemoryStore(clock=clock) if max_keys is None else MemoryStore(max_keys, clock)
    return shm_store(max_keys, clock=clock)
