"""``ratewarden serve``'s logs: one JSON object a line (or text) on stderr, each with its event
name and fields (``event``), from the service and from the workers alike."""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

__all__ = ["JSONFormatter", "TextFormatter", "configure_logging", "event", "log"]

log = logging.getLogger("ratewarden.serve")


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``event``, ``logger``, ``pid``, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", "log"),
            "logger": record.name,
            "pid": record.process,
        }
        message = record.getMessage()
        if message != out["event"]:
            out["message"] = message
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``ts level [pid] event message key=value...``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds")
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items())
        event = getattr(record, "event", "log")
        text = f"{ts} {record.levelname.lower()} [{record.process}] {event}: {record.getMessage()}"
        if fields:
            text += f" {fields}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure_logging(format: str = "json", level: str = "info") -> None:
    """Send the ``ratewarden`` and ``uvicorn`` logs to stderr in ``format`` (``json`` or ``text``).

    The service's events (``ratewarden.serve``) are logged from ``level``; the library's own lines
    (a refusal each, at INFO) only from WARNING unless ``level`` is ``debug``, so a flood of refusals
    does not become a flood of log lines.

    Args:
        format: ``"json"`` (one object per line) or ``"text"``.
        level: The least severe level logged (``debug``, ``info``, ``warning``, ``error``).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if format == "json" else TextFormatter())
    chosen = logging.getLevelName(level.upper())
    quiet = chosen if chosen <= logging.DEBUG else max(chosen, logging.WARNING)
    for name, least in (("ratewarden.serve", chosen), ("ratewarden", quiet), ("uvicorn", quiet), ("uvicorn.error", quiet)):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(least)
        logger.propagate = False


def event(level: int, name: str, message: str = "", **fields: Any) -> None:
    """Log the service's event ``name`` with its ``fields`` (``message`` defaults to the name)."""
    log.log(level, message or name, extra={"event": name, "fields": fields})
