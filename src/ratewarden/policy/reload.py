"""Reloading a policy file without a restart: on change (mtime polling in a daemon thread, no
dependency), on ``SIGHUP``, or on an explicit ``reload()`` call (e.g. from an admin endpoint).

The new policy is parsed and validated completely before ``apply`` is called, and ``apply``
swaps it in with a single assignment, so a request sees either the old policy or the new one.
A file with errors, or one that limits nothing (``load_policy``: empty, unless it says
``allow_empty = true``), is rejected with its problems logged (and kept in ``last_error``); the
previous policy stays in force.

A file cut short by a slow writer can be a valid policy that lacks its last rules, so a reload
uses only a file that has stopped changing: two reads at least ``settle`` seconds apart saw the
same size, mtime, ctime, inode and contents (SHA-256), and the second read's bytes are parsed.
The watcher keeps the old policy until that holds; ``SIGHUP`` and ``reload()`` wait for it (at
most ``settle_timeout``), then load, or refuse a file that never settled. Each reload logs one
line naming the rules and groups it added, removed and changed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from .loader import decode_policy, policy_format, unreadable
from .problems import PolicyError, Problem
from .schema import Policy, describe_rule

__all__ = ["PolicyReloader", "policy_changes"]

log = logging.getLogger("ratewarden.policy")

_Signature = tuple[int, int, int, int]  # mtime_ns, ctime_ns, size, inode
_SHOWN = 20  # names shown per list in the reload log line
_NAME_CHARS = 60  # characters shown per name


@dataclass(frozen=True)
class _Read:
    """One read of the policy file: what ``fstat`` said after the read, and the bytes read (or
    why it could not be read)."""

    signature: _Signature | None
    digest: bytes = b""
    data: bytes = b""
    error: OSError | None = None

    def same(self, other: _Read) -> bool:
        """Whether ``other`` saw the same file: same size, times, inode and contents."""
        return self.signature == other.signature and self.digest == other.digest and (self.error is None) == (other.error is None)


def _signature(st: os.stat_result) -> _Signature:
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def _read(path: Path) -> _Read:
    try:
        with path.open("rb") as f:
            data = f.read()
            st = os.fstat(f.fileno())
    except OSError as exc:
        return _Read(None, error=exc)
    return _Read(_signature(st), hashlib.sha256(data).digest(), data)


class PolicyReloader:
    """Watches ``path`` and calls ``apply(policy)`` with each valid new version.

    Args:
        path: The policy file.
        apply: Receives each valid new version.
        interval: Seconds between checks of the file.
        settle: Seconds between two reads of a changed file that must see the same size, mtime
            and contents before it is used; the old policy stays meanwhile.
        settle_timeout: Seconds ``reload()`` (``SIGHUP``) waits for the file to settle before it
            refuses it.
        current: The policy in force, when the caller loaded it itself (so the first reload's log
            line can say what changed).
    """

    def __init__(
        self, path: str | Path, apply: Callable[[Policy], None], *, interval: float = 1.0, settle: float = 0.5,
        settle_timeout: float = 10.0, current: Policy | None = None,
    ) -> None:
        if not interval > 0:
            raise ConfigurationError(f"reload interval must be positive seconds, got {interval!r}")
        if not 0 <= settle < float("inf"):
            raise ConfigurationError(f"reload settle must be seconds >= 0, got {settle!r}")
        if not settle <= settle_timeout < float("inf"):
            raise ConfigurationError(f"reload settle_timeout must be seconds >= settle ({settle!r}), got {settle_timeout!r}")
        self.path = Path(path)
        self.apply = apply
        self.interval = interval
        self.settle = settle
        self.settle_timeout = settle_timeout
        self.policy = current  # the policy this reloader last applied
        self.last_changes: dict[str, list[str]] = {}  # what the last reload changed (policy_changes)
        self._pending: tuple[_Read, float] | None = None  # a changed file's read, and when first seen
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

    def _stat(self) -> _Signature | None:
        try:
            return _signature(os.stat(self.path))
        except OSError:
            return None

    def load(self) -> Policy:
        """Load and apply the file now; raises ``PolicyError`` if it is invalid (start-up use)."""
        with self._lock:
            before = self._stat()  # taken before the read: a write in between is seen by the next check
            read = _read(self.path)
            self._signature = before if before is not None else read.signature
            policy = self._decode(read)
            self.apply(policy)
            self.policy = policy
            return policy

    def reload(self) -> bool:
        """Load and apply the file once it has settled, if it is valid; ``False`` (old policy
        kept) if not, or if it was still changing after ``settle_timeout``. Blocks for at least
        ``settle`` seconds: from async code, run it in a thread."""
        with self._lock:
            read = self._settled_read()
            if read is None:
                log.info("policy reload abandoned: the reloader is stopping")
                return False
            if isinstance(read, str):
                return self._refuse(PolicyError([Problem("", read, None, str(self.path))]))
            return self._use(read)

    def check(self) -> bool | None:
        """Reload if the file changed since the last load and has stopped changing; ``None`` when
        it did not change, or is still settling (a later check reads it)."""
        with self._lock:
            signature = self._stat()
            if signature is None or signature == self._signature:
                self._pending = None
                return None
            read, now = _read(self.path), time.monotonic()
            pending = self._pending
            if pending is None or not pending[0].same(read):
                self._pending = (read, now)
                if self.settle > 0:
                    return None
            elif now - pending[1] < self.settle:
                return None
            return self._use(read)

    def _settled_read(self) -> _Read | str | None:
        """Read the file until two reads ``settle`` apart agree; why not after ``settle_timeout``,
        ``None`` when ``stop()`` is called meanwhile."""
        first, since = _read(self.path), time.monotonic()
        if self.settle == 0:
            return first
        deadline = since + self.settle_timeout
        stoppable = not self._stop.is_set()  # stop() ends a wait that began before it
        step = self.settle / 5
        while True:
            if stoppable and self._stop.wait(step):
                return None
            if not stoppable:
                time.sleep(step)
            read, now = _read(self.path), time.monotonic()
            if not read.same(first):
                first, since = read, now
            elif now - since >= self.settle:
                return read
            if now >= deadline:
                return (
                    f"the file was still changing after {self.settle_timeout:g}s (its size, mtime or contents "
                    f"differed between reads {self.settle:g}s apart), so it may be half-written"
                )

    def _decode(self, read: _Read) -> Policy:
        if read.error is not None:
            policy_format(self.path)  # a wrong file type says so before a missing file does
            raise unreadable(self.path, read.error)
        return decode_policy(read.data, self.path)

    def _use(self, read: _Read) -> bool:
        """Apply what ``read`` holds, if valid; the caller holds the lock."""
        self._pending = None
        self._signature = read.signature
        try:
            policy = self._decode(read)
            self.apply(policy)  # refuses a policy the store cannot serve (ConfigurationError)
        except ConfigurationError as exc:  # PolicyError is one
            return self._refuse(exc)
        self.last_error = None
        self.reloads += 1
        previous, self.policy = self.policy, policy
        changes = policy_changes(previous, policy)
        _log_changes(self.path, previous, policy, changes)
        self.last_changes = {key: _shown(names) for key, names in changes.items()}
        return True

    def _refuse(self, exc: ConfigurationError) -> bool:
        self.last_error = exc
        self.failures += 1
        log.error("policy reload rejected, keeping the previous policy:\n%s", exc)
        return False

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


def _rule_tables(policy: Policy) -> dict[str, object]:
    """Each rule's name and what defines it: its table as read, or its description when the
    policy was not read from a file."""
    tables = policy.data.get("rules")
    if isinstance(tables, list) and len(tables) == len(policy.rules):
        return {rule.name: table for rule, table in zip(policy.rules, tables, strict=True)}
    return {rule.name: describe_rule(rule) for rule in policy.rules}


def _group_tables(policy: Policy) -> dict[str, object]:
    groups = policy.data.get("groups")
    if isinstance(groups, Mapping):
        return {str(name): spec for name, spec in groups.items()}
    return dict(policy.tiers.groups) if policy.tiers is not None else {}


def _diff(old: Mapping[str, object], new: Mapping[str, object]) -> tuple[list[str], list[str], list[str]]:
    added = [name for name in new if name not in old]
    removed = [name for name in old if name not in new]
    changed = [name for name in new if name in old and old[name] != new[name]]
    return added, removed, changed


def policy_changes(old: Policy | None, new: Policy) -> dict[str, list[str]]:
    """What ``new`` adds, removes and changes against ``old``, by name: ``rules_added``,
    ``rules_removed``, ``rules_changed`` (a rule's table differs: its rate, key, path...),
    ``groups_*`` (the tiers' groups and their limits) and ``sections_changed`` (``settings``,
    ``identity``, ``bans``, named only: the identity section holds API keys). Empty lists are
    left out; with no ``old``, every rule and group is added.

    Args:
        old: The policy in force before, if known.
        new: The policy now in force.
    """
    empty = Policy([])
    before = old if old is not None else empty
    out: dict[str, list[str]] = {}
    for kind, tables in (("rules", _rule_tables), ("groups", _group_tables)):
        for what, names in zip(("added", "removed", "changed"), _diff(tables(before), tables(new)), strict=True):
            if names:
                out[f"{kind}_{what}"] = names
    sections = [s for s in ("version", "settings", "identity", "bans") if before.data.get(s) != new.data.get(s)]
    if sections and old is not None:
        out["sections_changed"] = sections
    return out


def _shown(names: list[str]) -> list[str]:
    """At most ``_SHOWN`` names of at most ``_NAME_CHARS`` characters, and how many more."""
    out = [name if len(name) <= _NAME_CHARS else name[: _NAME_CHARS - 3] + "..." for name in names[:_SHOWN]]
    if len(names) > _SHOWN:
        out.append(f"and {len(names) - _SHOWN} more")
    return out


def _log_changes(path: Path, old: Policy | None, new: Policy, found: dict[str, list[str]]) -> None:
    """One line: ``policy reloaded from policy.toml: 3 rules; rules added [b], removed [a]; ...``."""
    changes = {key: _shown(names) for key, names in found.items()}
    parts = []
    for kind in ("rules", "groups", "sections"):
        listed = [
            f"{what} [{', '.join(changes[f'{kind}_{what}'])}]"
            for what in ("added", "removed", "changed") if f"{kind}_{what}" in changes
        ]
        if listed:
            parts.append(f"{kind} " + ", ".join(listed))
    summary = "; ".join(parts) if parts else "no changes"
    if old is None:
        summary += " (the policy before is unknown to this reloader)"
    fields: dict[str, object] = {"path": str(path), "rules": len(new.rules), **changes}
    log.info(
        "policy reloaded from %s: %d rules; %s", path, len(new.rules), summary,
        extra={"event": "policy_reloaded", "fields": fields},
    )
