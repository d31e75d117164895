"""Progress for a long bench run (``Heartbeat``): a log that, while nothing else is said for
``interval`` seconds, says what is still running and for how long, so no step is mistaken for a hang."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["PROGRESS_SECONDS", "Heartbeat"]

#: The longest silence of a ``Heartbeat`` (the issue's bound is 15 s; a line comes well before it).
PROGRESS_SECONDS = 10.0
#: The widest line a heartbeat writes (a terminal's 120 columns).
WIDTH = 120


class Heartbeat:
    """A log (call it with a line) that repeats the last step's line with the time it has taken
    whenever ``interval`` seconds pass without a line; runs while its ``with`` block does."""

    def __init__(self, log: Callable[[str], None], interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._interval, self._clock = log, interval or PROGRESS_SECONDS, clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last = self._since = clock()
        self._step = "starting"
        self._thread: threading.Thread | None = None

    def __call__(self, line: str) -> None:
        with self._lock:
            self._last = self._since = self._clock()
            self._step = line.strip()
            self._log(line)

    def _beat(self) -> None:
        tick = min(0.5, self._interval / 4)
        while not self._stop.wait(tick):
            with self._lock:
                now = self._clock()
                if now - self._last >= self._interval:
                    self._last = now
                    line = f"   ... still running ({now - self._since:.0f} s since: {self._step})"
                    self._log(line if len(line) <= WIDTH else line[: WIDTH - 2] + "…)")

    def __enter__(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._beat, name="bench-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
