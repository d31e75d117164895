"""The Flask app the gunicorn tests serve: one view limited to ``RW_LIMIT`` on the store named by
``RATEWARDEN_STORAGE_URL`` (gcra, so a burst admits exactly the limit whenever it runs); every
answer says which worker process sent it (``x-pid``)."""

from __future__ import annotations

import os

from flask import Flask, Response

from ratewarden.flask import RateLimiter

app = Flask(__name__)
app.config.update(
    RATEWARDEN_STORAGE_URL=os.environ.get("RATEWARDEN_STORAGE_URL", "memory://"),
    RATEWARDEN_ALGORITHM="gcra",
)
limiter = RateLimiter(app)


@app.get("/limited")
@limiter.limit(f"{os.environ.get('RW_LIMIT', '100')}/day", key=lambda scope: "everyone")
def limited() -> str:
    return "ok"


@app.after_request
def with_pid(response: Response) -> Response:
    response.headers["x-pid"] = str(os.getpid())
    return response
