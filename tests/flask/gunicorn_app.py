"""The Flask app the gunicorn tests serve (``tests.flask.gunicorn_app:app``), configured by
environment: ``RATEWARDEN_STORAGE_URL`` (the store, as the README's deploy paragraph sets it),
``RATEWARDEN_KEY_PREFIX`` (a fresh one per test on a shared server), ``RW_LIMIT`` (the limit of
``/limited``, per day, all charged to one key; gcra, so a burst admits exactly the limit whenever it
runs), ``RW_SLEEP`` (seconds an admitted request takes, so one worker cannot take them all) and
``RW_PIDS`` (a directory where every answer leaves a file named after its worker's pid). Every
answer also says which worker sent it (``x-pid``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from flask import Flask, Response

from ratewarden.flask import RateLimiter

PIDS = os.environ.get("RW_PIDS")
SLEEP = float(os.environ.get("RW_SLEEP", "0"))

app = Flask(__name__)
app.config.update(
    RATEWARDEN_STORAGE_URL=os.environ.get("RATEWARDEN_STORAGE_URL", "memory://"),
    RATEWARDEN_KEY_PREFIX=os.environ.get("RATEWARDEN_KEY_PREFIX", "rw"),
    RATEWARDEN_ALGORITHM="gcra",
)
limiter = RateLimiter(app)


@app.get("/limited")
@limiter.limit(f"{os.environ.get('RW_LIMIT', '100')}/day", key=lambda scope: "everyone")
def limited() -> str:
    if SLEEP:
        time.sleep(SLEEP)
    return "ok"


@app.after_request
def with_pid(response: Response) -> Response:
    response.headers["x-pid"] = str(os.getpid())
    if PIDS:
        Path(PIDS, str(os.getpid())).touch()
    return response
