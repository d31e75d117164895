"""Issue 39: what a flask-limiter app's handlers and clients see after the move, without a silent
change: ``e.description`` is flask-limiter's text, ``RATEWARDEN_HEADER_RESET = "epoch"`` gives its
``X-RateLimit-Reset``, limit names are the rates as written, and the documented window difference
holds (``fixed_window`` ends on the clock's minute, ``sliding_log`` counts from the first hit)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from flask import Flask

from ratewarden import ConfigurationError, Limiter, MemoryStore
from ratewarden.flask import RateLimiter, RateLimitExceeded
from ratewarden.rates import parse_rate
from tests.vectors.runner import FakeClock

# 23 s into a minute: a clock-aligned window has 37 s left, as in the issue.
NOW = 6000.0 + 23


def app_with(rate: str, *, handler: bool = False, limiter: Limiter | None = None, **config: Any) -> tuple[Flask, list[Any]]:
    """An app limiting ``/ping`` to ``rate``; with ``handler``, a flask-limiter style 429 handler
    that keeps each exception it gets."""
    app = Flask(__name__)
    app.config.update(config)
    extension = RateLimiter(app, limiter=limiter or Limiter(MemoryStore(clock=FakeClock(NOW))))
    seen: list[Any] = []
    if handler:

        @app.errorhandler(429)
        def too_many(e: RateLimitExceeded) -> tuple[str, int]:
            seen.append(e)
            return f"ratelimit exceeded {e.description}", 429

    @app.get("/ping")
    @extension.limit(rate)
    def ping() -> str:
        return "pong"

    return app, seen


@pytest.mark.parametrize(
    ("rate", "text"),
    [
        ("5/minute", "5 per 1 minute"),
        ("10/second", "10 per 1 second"),
        ("100/hour", "100 per 1 hour"),
        ("1000/day", "1000 per 1 day"),
        ("5 per 30 seconds", "5 per 30 second"),
        ("2/5m", "2 per 5 minute"),
        ("7/1w", "7 per 7 day"),
        ("50/250ms", "50 per 250 millisecond"),
    ],
)
def test_limits_are_written_as_flask_limiter_writes_them(rate: str, text: str) -> None:
    from ratewarden.flask.responses import limit_text

    assert limit_text(parse_rate(rate)) == text


def test_a_handler_reads_flask_limiters_description() -> None:
    """Was the whole problem+json body; flask-limiter's handlers print ``e.description``."""
    app, seen = app_with("5/minute", handler=True)
    client = app.test_client()
    replies = [client.get("/ping") for _ in range(6)]
    assert [r.status_code for r in replies] == [200] * 5 + [429]
    assert seen[0].description == "5 per 1 minute"
    assert replies[5].get_data(as_text=True) == "ratelimit exceeded 5 per 1 minute"
    assert str(seen[0]) == "429 Too Many Requests: 5 per 1 minute"  # what a log line shows


def test_the_description_is_the_limits_librarys_own_text() -> None:
    """The same words as flask-limiter (``str`` of the limits library's item), where it is installed."""
    from ratewarden.flask.responses import limit_text

    limits = pytest.importorskip("limits")
    for rate in ("5/minute", "10/second", "100/hour", "1000/day", "5 per 30 seconds", "2 per 5 minutes"):
        assert limit_text(parse_rate(rate)) == str(limits.parse(rate)), rate


def test_the_description_names_the_limit_that_was_hit() -> None:
    app, seen = app_with("100/hour; 1/second", handler=True)
    client = app.test_client()
    assert [client.get("/ping").status_code for _ in range(2)] == [200, 429]
    assert seen[0].description == "1 per 1 second"


def test_the_problem_body_stays_on_the_exception_and_the_default_429_is_unchanged() -> None:
    plain, _ = app_with("1/minute")
    default = [plain.test_client().get("/ping") for _ in range(2)][1]
    assert default.status_code == 429 and default.content_type == "application/problem+json"
    body = default.get_json()
    assert body["type"] == "about:blank" and body["policy"] == "ping" and body["retry_after"] == 37

    handled, seen = app_with("1/minute", handler=True)
    [handled.test_client().get("/ping") for _ in range(2)]
    assert json.loads(seen[0].body) == body  # the 429 a handler replaces, as text
    assert seen[0].get_response().get_data(as_text=True) == seen[0].body  # ``return e`` sends it


def _reset(reply: Any) -> int:
    return int(reply.headers["X-RateLimit-Reset"])


@pytest.mark.parametrize("handler", [False, True], ids=["answered-before-flask", "answered-by-flask"])
def test_header_reset_epoch_gives_flask_limiters_unix_time(handler: bool) -> None:
    app, _ = app_with("2/minute", handler=handler, RATEWARDEN_HEADER_RESET="epoch")
    client = app.test_client()
    before = int(time.time())
    replies = [client.get("/ping") for _ in range(3)]
    after = int(time.time())
    assert [r.status_code for r in replies] == [200, 200, 429]
    for reply in replies:  # 37 s left in the clock's minute, as a Unix time
        assert before + 37 <= _reset(reply) <= after + 37
        assert reply.headers["RateLimit"].endswith(";t=37")  # the IETF header keeps its seconds
    assert replies[2].headers["Retry-After"] == "37"


def test_header_reset_defaults_to_seconds_and_takes_the_argument() -> None:
    app, _ = app_with("2/minute")
    assert _reset(app.test_client().get("/ping")) == 37
    app = Flask(__name__)
    extension = RateLimiter(app, limiter=Limiter(MemoryStore(clock=FakeClock(NOW))), header_reset="epoch")
    app.get("/ping")(extension.limit("2/minute")(lambda: "pong"))
    assert _reset(app.test_client().get("/ping")) >= int(time.time()) + 36


def test_header_reset_is_checked_and_named() -> None:
    with pytest.raises(ConfigurationError, match="'seconds' or 'epoch'"):
        app_with("1/s", RATEWARDEN_HEADER_RESET="X-RateLimit-Reset")
    with pytest.raises(ConfigurationError, match="did you mean RATEWARDEN_HEADER_RESET"):
        app_with("1/s", RATEWARDEN_HEADERS_RESET="epoch")
    with pytest.raises(ConfigurationError, match=r"RATELIMIT_HEADER_RESET: .*RATEWARDEN_HEADER_RESET = 'epoch'"):
        app_with("1/s", RATELIMIT_HEADER_RESET="X-Reset")


def test_names_are_the_endpoint_and_the_rates_as_written() -> None:
    """No module path reaches a client; several rates are named as written, not in milliseconds."""
    app, _ = app_with("2/hour; 50/day")
    replies = [app.test_client().get("/ping") for _ in range(3)]
    assert replies[0].headers["RateLimit-Policy"] == '"ping-2/hour";q=2;w=3600, "ping-50/day";q=50;w=86400'
    assert replies[2].get_json()["policy"] == "ping-2/hour"
    assert __name__ not in replies[2].get_data(as_text=True)


def test_window_alignment_is_as_documented() -> None:
    """docs/flask.md: the 6th of 5/minute, 23 s into a minute, is told 37 s by ``fixed_window``
    (the clock's minute) and 60 s by ``sliding_log`` (the first hit's minute, as flask-limiter)."""
    fixed, _ = app_with("5/minute")
    moving, _ = app_with("5/minute", RATEWARDEN_ALGORITHM="sliding_log")
    assert [fixed.test_client().get("/ping") for _ in range(6)][5].headers["Retry-After"] == "37"
    assert [moving.test_client().get("/ping") for _ in range(6)][5].headers["Retry-After"] == "60"


def test_sliding_log_retry_after_matches_flask_limiter() -> None:
    """Side by side with flask-limiter itself (where installed), on the real clock."""
    flask_limiter = pytest.importorskip("flask_limiter")
    theirs = Flask("theirs")
    limiter = flask_limiter.Limiter(lambda: "client", app=theirs, headers_enabled=True, storage_uri="memory://")
    theirs.get("/ping")(limiter.limit("5/minute")(lambda: "pong"))
    ours, _ = app_with("5/minute", limiter=Limiter(MemoryStore()), RATEWARDEN_ALGORITHM="sliding_log")
    them = [theirs.test_client().get("/ping") for _ in range(6)][5]
    us = [ours.test_client().get("/ping") for _ in range(6)][5]
    assert them.status_code == us.status_code == 429
    assert abs(int(them.headers["Retry-After"]) - int(us.headers["Retry-After"])) <= 1
    assert them.get_data(as_text=True).count("5 per 1 minute") == 1  # the description we now give too
