"""A file written while a worker starts is not lost: the worker notes each file's signature before
reading it, so a write landing between its read and that note is seen as a change at the next poll
(with ``--workers 2`` one worker took a file that arrived as it started for one it had read, and
answered OK to every call while the other enforced the limit)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ratewarden.serve import worker as worker_module
from ratewarden.serve.config import ServeConfig
from ratewarden.serve.envoy_runtime import RuntimeLayout
from ratewarden.serve.worker import Worker

RULE = "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n"


def _poll_until(worker: Worker, done: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "the worker never picked up the file written while it started"
        worker.poll()
        time.sleep(0.02)


def test_envoy_file_written_between_read_and_signature(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "ratelimit" / "config"
    config.mkdir(parents=True)
    path = config / "rl.yaml"
    real = worker_module.load_envoy

    def read_then_write(*args: Any, **kwargs: Any) -> Any:
        loaded = real(*args, **kwargs)
        if not path.exists():
            path.write_text(RULE)  # the write lands right after the worker has read the file
        return loaded

    monkeypatch.setattr(worker_module, "load_envoy", read_then_write)
    layout = RuntimeLayout(tmp_path, subdirectory="ratelimit", watch_root=False)
    worker = Worker(ServeConfig(runtime=layout, watch=0.02), "memory://")
    assert worker.rls is not None
    assert "rl" not in worker.rls.domains  # started with no file yet
    _poll_until(worker, lambda: "rl" in worker.rls.domains)  # type: ignore[union-attr]


def test_policy_file_written_between_read_and_signature(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "policy.toml"
    before = 'version = 1\n[[rules]]\nname = "api"\npath = "/api/**"\nrate = "5/minute"\n'
    after = before.replace("5/minute", "70/minute")  # another size: a change even within one timestamp tick
    path.write_text(before)
    real = worker_module.load_policy

    def read_then_write(*args: Any, **kwargs: Any) -> Any:
        loaded = real(*args, **kwargs)
        path.write_text(after)
        return loaded

    monkeypatch.setattr(worker_module, "load_policy", read_then_write)
    worker = Worker(ServeConfig(policy=path, watch=0.02), "memory://")
    assert worker.reloader is not None
    first = worker.reloader.policy
    assert first is not None and "5/minute" in repr(first.data)
    _poll_until(worker, lambda: "70/minute" in repr(worker.reloader.policy.data))  # type: ignore[union-attr]


def test_policy_reloader_load_notes_the_signature_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PolicyReloader.load`` (the library's start-up path) has the same order: a write landing after
    its read of the bytes, before it looked at the file's identity, is a change for the next ``check``."""
    import os

    from ratewarden.policy import reload as reload_module

    path = tmp_path / "policy.toml"
    before = 'version = 1\n[[rules]]\nname = "api"\npath = "/api/**"\nrate = "5/minute"\n'
    path.write_text(before)
    real_fstat = os.fstat

    def write_then_fstat(fd: int) -> os.stat_result:
        if "5/minute" in path.read_text():
            path.write_text(before.replace("5/minute", "70/minute"))  # in place: the same inode
        return real_fstat(fd)

    applied: list[Any] = []
    reloader = reload_module.PolicyReloader(path, applied.append, settle=0.0)
    monkeypatch.setattr(reload_module.os, "fstat", write_then_fstat)
    assert "5/minute" in repr(reloader.load().data)
    monkeypatch.undo()
    assert reloader.check() is True
    assert "70/minute" in repr(applied[-1].data)
