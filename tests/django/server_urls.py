"""The URLconf of tests/django/server_settings.py: ``/burst`` takes ``RW_SLEEP`` seconds (so one
worker cannot take every request) and, with ``RW_PIDS``, leaves a file named after its worker's pid
in that directory (which workers took part); every answer it sends says so in ``x-pid`` too.
``/warm-up`` is not limited: it only leaves the pid file."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from django.http import HttpResponse
from django.urls import path

PIDS = os.environ.get("RW_PIDS")
SLEEP = float(os.environ.get("RW_SLEEP", "0"))


def burst(request: Any) -> HttpResponse:
    if PIDS:
        Path(PIDS, str(os.getpid())).touch()
    if SLEEP:
        time.sleep(SLEEP)
    response = HttpResponse("ok")
    response["x-pid"] = str(os.getpid())
    return response


def warm_up(request: Any) -> HttpResponse:
    """Unlimited: which workers are up (``RW_PIDS``)."""
    if PIDS:
        Path(PIDS, str(os.getpid())).touch()
    return HttpResponse("up")


urlpatterns = [path("burst", burst), path("warm-up", warm_up)]
