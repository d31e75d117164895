"""envoyproxy/ratelimit's runtime directory (``RUNTIME_ROOT``, ``RUNTIME_SUBDIRECTORY``,
``RUNTIME_APPDIRECTORY``, ``RUNTIME_IGNOREDOTFILES``, ``RUNTIME_WATCH_ROOT``): which files it loads
(``RuntimeLayout.files``, as its goruntime loader walks the directory) and what tells that they
changed (``RuntimeLayout.signature``: the root's target, for its symlink swap, and every file's
identity).

With ``RUNTIME_WATCH_ROOT=true`` (its default) the reference walks ``<root>/<subdirectory>`` and keeps
the files whose path there, ``/`` read as ``.``, starts with ``<appdirectory>.``: every file under
``<root>/<subdirectory>/<appdirectory>/``, at any depth; it reloads when ``<root>`` (a symlink) is
swapped. With ``false`` it walks ``<root>/<subdirectory>/<appdirectory>`` and reloads on a change
there. An empty subdirectory (with ``true``) or application directory (with ``false``) loads nothing.
Every file found is a configuration, whatever its name; a directory that is a symlink is not
entered; with ``RUNTIME_IGNOREDOTFILES``, names starting with ``.`` are skipped (a Kubernetes
ConfigMap's ``..data`` and ``..2024_...`` entries among them).
"""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RuntimeLayout"]

log = logging.getLogger("ratewarden.serve")


@dataclass(frozen=True)
class RuntimeLayout:
    """Where the reference reads its configuration files.

    Args:
        root: ``RUNTIME_ROOT``.
        subdirectory: ``RUNTIME_SUBDIRECTORY``.
        appdirectory: ``RUNTIME_APPDIRECTORY``.
        ignore_dotfiles: ``RUNTIME_IGNOREDOTFILES``.
        watch_root: ``RUNTIME_WATCH_ROOT``.
    """

    root: Path
    subdirectory: str = ""
    appdirectory: str = "config"
    ignore_dotfiles: bool = False
    watch_root: bool = True

    @property
    def walked(self) -> Path | None:
        """The directory walked; ``None`` when the layout loads nothing (the reference's nil loader)."""
        if self.watch_root:
            return self.root / self.subdirectory if self.subdirectory else None
        return self.root / self.subdirectory / self.appdirectory if self.appdirectory else None

    @property
    def directory(self) -> Path:
        """Where the configuration files are: ``<root>/<subdirectory>/<appdirectory>``."""
        return self.root / self.subdirectory / self.appdirectory

    def describe(self) -> str:
        """The layout as its variables say it, for messages."""
        return (f"RUNTIME_ROOT={self.root} RUNTIME_SUBDIRECTORY={self.subdirectory} "
                f"RUNTIME_APPDIRECTORY={self.appdirectory}")

    def files(self) -> list[Path]:
        """The configuration files, sorted as the reference walks them (lexically, depth first)."""
        walked = self.walked
        if walked is None:
            return []
        found: list[tuple[str, Path]] = []
        self._walk(walked, "", found)
        if self.watch_root:
            prefix = self.appdirectory + "."
            found = [(key, path) for key, path in found if key.startswith(prefix)]
        return [path for _, path in found]

    def _walk(self, directory: Path, key: str, found: list[tuple[str, Path]]) -> None:
        try:
            names = sorted(os.listdir(directory))
        except OSError as exc:
            log.warning("runtime: cannot read %s: %s", directory, exc.strerror, extra={"event": "runtime_unreadable"})
            return
        for name in names:
            if self.ignore_dotfiles and name.startswith("."):
                continue
            path = directory / name
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            entry = f"{key}.{name}" if key else name
            if stat.S_ISDIR(mode):
                self._walk(path, entry, found)
            elif not path.is_dir():  # a symlink to a directory is not entered, nor read
                found.append((entry, path))

    def signature(self) -> tuple[object, ...]:
        """What changes when the configuration may have: where the root points, and each file's
        path, inode, size and modification time."""
        try:
            target: object = os.path.realpath(self.root)
        except OSError:
            target = None
        out: list[object] = [target]
        for path in self.files():
            try:
                st = path.stat()
                out.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((str(path), 0, 0, 0))
        return tuple(out)
