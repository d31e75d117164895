"""Reloading a policy file without a restart: on change (mtime polling in a daemon thread, no
dependency), on ``SIGHUP``, or on an explicit ``reload()`` call (e.g. from an admin endpoint).

The new policy is parsed and validated completely before ``apply`` is called, and ``apply``
swaps it in with a single assignment, so a request sees either the old policy or the new one.
A file with errors, or one that limits nothing (``load_policy``: empty, unless it says
``allow_empty = true``), is rejected with its problems logged (and kept in ``last_error``); the
previous policy stays in force. The watcher reads a changed file only once it has stopped
changing (``settle``), so it does not read a file that is still being written.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from .loader import load_policy
from .schema import Policy

__all__ = ["PolicyReloader"]

log = logging.getLogger("ratewarden.policy")


class PolicyReloader:
    """Watches ``path`` and calls ``apply(policy)`` with each valid new version.

    Args:
        path: The policy file.
        apply: Receives each valid new version.
        interval: Seconds between checks of the file.
        settle: Seconds a changed file's size, mtime and inode must stay the same (seen by two
            checks at least this far apart) before it is read; the old policy stays meanwhile.
    """

    def __init__(
        self, path: str | Path, apply: Callable[[Policy], None], *, interval: float = 1.0, settle: float = 0.5
    ) -> None:
        if not interval > 0:
            raise ConfigurationError(f"reload interval must be positive seconds, got {interval!r}")
        if not 0 <= settle < float("inf"):
            raise ConfigurationError(f"reload settle must be seconds >= 0, got {settle!r}")
        self.path = Path(path)
        self.apply = apply
        self.interval = interval
        self.settle = settle
        self._pending: tuple[tuple[int, int, int], float] | None = None  # a change seen, and when
        self.last_error: ConfigurationError | None = None
        self.reloads = 0
        self.failures = 0
        self._signature = self._stat()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_handler: Any = None
        self._sighup_handler: Callable[[int, Any], None] | None = None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load(self) -> Policy:
        """Load and apply the file now; raises ``PolicyError`` if it is invalid (start-up use)."""
        with self._lock:
            self._signature = self._stat()
            policy = load_policy(self.path)
            self.apply(policy)
            return policy

    def reload(self) -> bool:
        """Load and apply the file if it is valid; ``False`` (old policy kept) if not."""
        with self._lock:
            self._signature = self._stat()
            try:
                policy = load_policy(self.path)
                self.apply(policy)  # refuses a policy the store cannot serve (ConfigurationError)
            except ConfigurationError as exc:  # PolicyError is one
                self.last_error = exc
                self.failures += 1
                log.error("policy reload rejected, keeping the previous policy:\n%s", exc)
                return False
            self.last_error = None
            self.reloads += 1
            log.info("policy reloaded from %s (%d rules)", self.path, len(policy.rules))
            return True

    def check(self) -> bool | None:
        """Reload if the file changed since the last load and has stopped changing; ``None`` when
        it did not change, or is still settling (a later check reads it)."""
        signature = self._stat()
        if signature is None or signature == self._signature:
            self._pending = None
            return None
        now = time.monotonic()
        pending = self._pending
        if pending is None or pending[0] != signature:
            self._pending = (signature, now)
            if self.settle > 0:
                return None
        elif now - pending[1] < self.settle:
            return None
        self._pending = None
        return self.reload()

    def start(self) -> None:
        """Poll the file every ``interval`` seconds in a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ratewarden-policy-reload", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            woken = self._wake.wait(self.interval)
            if self._stop.is_set():
                return
            try:
                if woken:
                    self._wake.clear()
                    self.reload()
                else:
                    self.check()
            except Exception:  # never let the watcher die
                log.exception("policy watcher failed; will retry")

    def stop(self) -> None:
        """Stop polling and give ``SIGHUP`` back to the handler installed before ours."""
        self.uninstall_sighup()
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5)
        self._wake.clear()

    def install_sighup(self) -> bool:
        """Reload on ``SIGHUP`` (main thread only, where the platform has it); ``False`` if not
        installed. A Python handler installed before is still called after ours (so the app's own
        ``SIGHUP`` use keeps working), and ``stop()`` puts it back."""
        if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
            return False
        if self._sighup_handler is not None:
            return True
        previous = signal.getsignal(signal.SIGHUP)

        def handler(signum: int, frame: Any) -> None:
            if self._thread is not None:
                self._wake.set()
            else:
                threading.Thread(target=self.reload, daemon=True).start()
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGHUP, handler)
        self._previous_handler = previous
        self._sighup_handler = handler
        return True

    def uninstall_sighup(self) -> None:
        """Restore the ``SIGHUP`` handler found by ``install_sighup``, unless another one replaced
        ours since (then it is left alone). Needs the main thread, like ``signal.signal``."""
        handler, self._sighup_handler = self._sighup_handler, None
        if handler is None:
            return
        if threading.current_thread() is not threading.main_thread():
            log.warning("SIGHUP handler not restored: stop() was called outside the main thread")
            return
        if signal.getsignal(signal.SIGHUP) is handler:
            signal.signal(signal.SIGHUP, self._previous_handler)
        self._previous_handler = None
