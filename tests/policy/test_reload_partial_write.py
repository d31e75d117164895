"""Issue 36, item 6: a policy file still being written is never reloaded half-way. A file cut
before its last rule is valid TOML that limits something, so only waiting for the file to stop
changing (the same size, mtime and contents across two reads ``settle`` apart) keeps the last rule
in force; this holds for the watcher, ``SIGHUP``, ``reload()`` and ``ratewarden serve``'s reloads.
A reload logs the rules and groups it adds, removes and changes."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ratewarden.policy import PolicyReloader
from ratewarden.policy.schema import Policy

RULE = """
[[rules]]
name = "{name}"
path = "/{name}/**"
rate = "{rate}"
key = "header:X-Client"
"""
NAMES = ("alpha", "beta", "gamma", "last")
CHUNK_GAP = 0.2  # seconds between the writer's chunks: less than the 0.5 s settle time


def _policy(rate: str, names: tuple[str, ...] = NAMES) -> str:
    return "version = 1\n" + "".join(RULE.format(name=n, rate=rate) for n in names)


def _replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_slowly(path: Path, text: str) -> None:
    """Rewrite ``path`` in place one rule at a time, as a slow ``cp`` or an editor over a network
    share would: every state but the last is valid TOML without the ``last`` rule."""
    chunks = ["version = 1\n", *(RULE.format(name=n, rate="7/min") for n in NAMES)]
    assert "".join(chunks) == text
    with path.open("w") as f:
        for chunk in chunks:
            f.write(chunk)
            f.flush()
            time.sleep(CHUNK_GAP)


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def _rates(policy: Policy) -> dict[str, str]:
    return {rule.name: str(rule.limits[0].rate) for rule in policy.rules}


def _check_never_partial(applied: list[Policy]) -> None:
    truncated = [sorted(_rates(p)) for p in applied if "last" not in _rates(p)]
    assert not truncated, f"a half-written policy was loaded: {truncated}"
    assert _rates(applied[-1]) == dict.fromkeys(NAMES, "7/minute")  # the final file is in force


def test_watcher_sighup_and_reload_never_load_a_half_written_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _replace(path, _policy("1000/min"))
    applied: list[Policy] = []
    reloader = PolicyReloader(path, applied.append, interval=0.02)  # settle: the 0.5 s default
    reloader.load()
    original = signal.getsignal(signal.SIGHUP)
    reloader.start()
    assert reloader.install_sighup()
    try:
        writer = threading.Thread(target=_write_slowly, args=(path, _policy("7/min")))
        writer.start()
        time.sleep(2.5 * CHUNK_GAP)  # two rules written, then each door is asked to reload
        os.kill(os.getpid(), signal.SIGHUP)  # the watcher thread reloads
        admin = threading.Thread(target=reloader.reload)  # an admin endpoint's reload()
        admin.start()
        writer.join()
        admin.join(10)
        _wait_for(lambda: bool(applied) and "7/minute" in _rates(applied[-1]).values())
        time.sleep(0.1)  # a late SIGHUP reload would land now
    finally:
        reloader.stop()
        signal.signal(signal.SIGHUP, original)
    _check_never_partial(applied)
    assert reloader.failures == 0


def test_serve_worker_sighup_and_polling_wait_for_the_file_to_settle(tmp_path: Path) -> None:
    from ratewarden.serve.config import ServeConfig
    from ratewarden.serve.worker import Worker

    path = tmp_path / "policy.toml"
    _replace(path, _policy("1000/min"))
    worker = Worker(ServeConfig(policy=path, watch=0.02), "memory://")
    reloader = worker.reloader
    assert reloader is not None
    applied: list[Policy] = []
    apply = reloader.apply

    def record(policy: Policy) -> None:
        applied.append(policy)
        apply(policy)

    reloader.apply = record
    stop = threading.Event()

    def watch() -> None:  # the worker's --watch loop
        while not stop.wait(0.02):
            worker.poll()

    threads = [
        threading.Thread(target=_write_slowly, args=(path, _policy("7/min"))),
        threading.Thread(target=watch),
    ]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2.5 * CHUNK_GAP)
        worker.reload("SIGHUP")  # what the worker's SIGHUP handler runs (in an executor thread)
        threads[0].join()
        _wait_for(lambda: bool(applied) and "7/minute" in _rates(applied[-1]).values())
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    _check_never_partial(applied)
    policy_app = worker.app.policy_app
    assert policy_app is not None and policy_app.policy is not None
    assert "last" in _rates(policy_app.policy)


def test_a_file_that_never_settles_is_refused_after_the_timeout(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "policy.toml"
    _replace(path, _policy("1000/min"))
    applied: list[Policy] = []
    reloader = PolicyReloader(path, applied.append, settle=0.3, settle_timeout=1.0)
    reloader.load()
    stop = threading.Event()

    def append_forever() -> None:
        with path.open("a") as f:
            while not stop.wait(0.1):
                f.write("# still writing\n")
                f.flush()

    writer = threading.Thread(target=append_forever)
    writer.start()
    try:
        with caplog.at_level(logging.ERROR, "ratewarden.policy"):
            started = time.monotonic()
            assert reloader.reload() is False
            assert 1.0 <= time.monotonic() - started < 3.0
    finally:
        stop.set()
        writer.join()
    assert len(applied) == 1 and reloader.failures == 1
    assert "still changing" in str(reloader.last_error)
    assert any("still changing" in r.getMessage() for r in caplog.records)


def test_a_rewrite_that_keeps_the_size_and_mtime_is_still_seen_and_settled(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    _replace(path, _policy("1000/min"))
    applied: list[Policy] = []
    reloader = PolicyReloader(path, applied.append, interval=0.01, settle=0.3)
    reloader.load()
    old = os.stat(path)
    new = _policy("3/min")
    path.write_text(new + " " * (old.st_size - len(new)))  # "1000" -> "3", padded to the same size
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))  # and the old mtime: only the contents differ
    assert os.stat(path).st_size == old.st_size
    assert reloader.check() is None and len(applied) == 1  # seen, not read before it settles
    time.sleep(0.35)
    assert reloader.check() is True and _rates(applied[-1])["last"] == "3/minute"


def test_the_reload_log_line_names_what_was_added_removed_and_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "policy.toml"
    _replace(path, _policy("10/min", ("alpha", "beta", "gamma")) + '\n[groups]\nfree = ["1/s"]\n')
    reloader = PolicyReloader(path, lambda policy: None, settle=0.05)
    reloader.load()
    changed = _policy("10/min", ("alpha", "gamma", "delta")).replace('name = "gamma"\npath = "/gamma/**"\nrate = "10/min"',
                                                                 'name = "gamma"\npath = "/gamma/**"\nrate = "20/min"')
    _replace(path, changed + '\n[groups]\npro = ["5/s"]\n')
    with caplog.at_level(logging.INFO, "ratewarden.policy"):
        assert reloader.reload() is True
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "policy_reloaded"]
    message = record.getMessage()
    assert "\n" not in message
    assert "rules added [delta]" in message and "removed [beta]" in message and "changed [gamma]" in message
    assert "groups added [pro], removed [free]" in message
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["rules_added"] == ["delta"] and fields["rules_removed"] == ["beta"]
    assert fields["rules_changed"] == ["gamma"] and fields["groups_added"] == ["pro"]


def test_the_reload_log_line_is_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "policy.toml"
    _replace(path, _policy("10/min", ("alpha",)))
    reloader = PolicyReloader(path, lambda policy: None, settle=0)
    reloader.load()
    _replace(path, _policy("10/min", tuple(f"rule-{i:04d}-{'x' * 100}" for i in range(500))))
    with caplog.at_level(logging.INFO, "ratewarden.policy"):
        assert reloader.reload() is True
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "policy_reloaded"]
    assert len(record.getMessage()) < 2000 and "and 480 more" in record.getMessage()
