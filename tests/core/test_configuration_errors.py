"""A bad start-up value raises ``ConfigurationError`` (issue 22), still a ``ValueError``, with the
message it always had: one representative of each family of checks (limiter, rule, middleware,
keys, stores, charges, delays, bans, metrics, policies), on the installed build (compiled or not).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

import pytest

from ratewarden import ConfigurationError, Limiter, MemoryStore, RateLimitMiddleware, Rule
from ratewarden.charges import Charge
from ratewarden.keys import ClientIP, compose
from ratewarden.policy import PolicyReloader, PolicyRule
from ratewarden.policy.bans import Bans
from ratewarden.policy.delay import Delay
from ratewarden.policy.keyspec import parse_key_spec
from ratewarden.policy.loader import parse_policy
from ratewarden.policy.sections import parse_duration
from ratewarden.policy.tiers import Identity, Tiers
from ratewarden.rules import compile_path


async def _app(scope: object, receive: object, send: object) -> None:  # pragma: no cover - never called
    pass


def _identity() -> Identity:
    return Identity(["header:X-API-Key"], keys={"k": "gold"}, unknown_group="free", anonymous_group="free")


def _block() -> None:
    asyncio.run(Bans().block(Limiter(), "10.0.0.1", -1))


CASES: list[tuple[str, Callable[[], object], str]] = [
    ("Limiter on_error", lambda: Limiter(on_error="sometimes"),  # type: ignore[arg-type]
     "on_error must be 'open' or 'closed', got 'sometimes'"),
    ("Limiter fallback", lambda: Limiter(fallback="remote"),  # type: ignore[arg-type]
     "fallback must be a local store, 'local' or None, got 'remote'"),
    ("Rule without a rate", lambda: Rule("/api/**"),
     "Rule('/api/**') needs a rate (e.g. '100/min') unless bypass=True"),
    # -1.5, not -1: the compiled Rule holds its cost as a float (it would say -1.0).
    ("Rule cost", lambda: Rule("/api/**", "10/s", cost=-1.5),
     "Rule('/api/**') cost must be a finite number >= 0, got -1.5"),
    ("Rule algorithm spelled with a hyphen", lambda: Rule("/api/**", "10/s", algorithm="token-bucket"),  # type: ignore[arg-type]
     "unknown algorithm 'token-bucket'; did you mean 'token_bucket'? choose one of: fixed_window, sliding_window, "
     "sliding_log, token_bucket, token_bucket_debt, leaky_bucket, gcra"),
    ("Rule algorithm named as flask-limiter does", lambda: Rule("/api/**", "10/s", algorithm="moving-window"),  # type: ignore[arg-type]
     "unknown algorithm 'moving-window'; did you mean 'sliding_log'? choose one of: fixed_window, sliding_window, "
     "sliding_log, token_bucket, token_bucket_debt, leaky_bucket, gcra"),
    ("rule path", lambda: compile_path("api/**"),
     "rule path 'api/**' must start with '/' (e.g. '/api/**') or 're:'"),
    ("rule regex", lambda: compile_path("re:("),
     "invalid regex in rule path 're:(': missing ), unterminated subpattern at position 0"),
    ("middleware headers", lambda: RateLimitMiddleware(_app, Limiter(), headers="sometimes"),  # type: ignore[arg-type]
     "headers must be 'always', 'on_limit' or 'off', got 'sometimes'"),
    ("middleware header_style", lambda: RateLimitMiddleware(_app, Limiter(), header_style="rfc"),  # type: ignore[arg-type]
     "header_style must be 'ietf', 'legacy' or 'both', got 'rfc'"),
    ("ClientIP ipv6_prefix", lambda: ClientIP(ipv6_prefix=0), "ipv6_prefix must be between 1 and 128, got 0"),
    ("ClientIP trusted proxies", lambda: ClientIP(["10.0.0.300/8"]),
     "invalid trusted proxy network: '10.0.0.300/8' does not appear to be an IPv4 or IPv6 network"),
    ("compose", lambda: compose(), "compose() needs at least one key function"),
    ("MemoryStore max_keys", lambda: MemoryStore(max_keys=0), "max_keys must be at least 1, got 0"),
    ("Charge statuses", lambda: Charge(["6xx"]),
     "invalid status '6xx': use a code (401), a class ('5xx') or a range ('400-499')"),
    ("Charge empty", lambda: Charge([]), "charge: statuses must name at least one status (e.g. [401, '5xx'])"),
    ("Delay max_wait", lambda: Delay(max_wait=0), "delay: max_wait must be positive seconds, got 0"),
    ("Bans after", lambda: Bans(after=0), "bans: 'after' must be at least 1 rejection, got 0"),
    ("Bans status", lambda: Bans(status=500),  # type: ignore[arg-type]
     "bans: 'status' must be 403 or 429, got 500"),
    ("Bans.block seconds", _block, "block: seconds must be positive and finite, got -1"),
    ("policy format", lambda: parse_policy("", format="json"), "unknown policy format 'json': use 'toml' or 'yaml'"),
    ("policy duration", lambda: parse_duration("soon"),
     "expected a duration (seconds or '30s', '5m', '1h'), got 'soon'"),
    ("policy key spec", lambda: parse_key_spec("cookie:id"),
     "invalid key 'cookie:id': use 'ip', 'identity', 'header:<Name>', 'bearer' or 'query:<name>'"),
    ("policy tiers", lambda: Tiers({}, _identity()), "tiers need at least one group"),
    ("policy rule", lambda: PolicyRule("/api/**", "1/s", tiers=Tiers({"free": "1/s", "gold": None}, _identity())),
     "PolicyRule('/api/**'): give either rate or tiers, not both"),
    ("policy reloader", lambda: PolicyReloader("policy.toml", lambda policy: None, interval=0),
     "reload interval must be positive seconds, got 0"),
]


@pytest.mark.parametrize(("make", "message"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_start_up_value_raises_configuration_error(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        make()
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)  # ``except ValueError`` callers still catch it


def test_metrics_near_ratio_raises_configuration_error() -> None:
    pytest.importorskip("prometheus_client")
    from ratewarden.metrics import Metrics

    with pytest.raises(ConfigurationError, match=re.escape("near_ratio must be in (0, 1], got 1.5")):
        Metrics(near_ratio=1.5)


def test_per_call_values_stay_plain_value_errors() -> None:
    """A request's cost comes with each call, not from configuration: a plain ``ValueError``."""
    limiter = Limiter()
    with pytest.raises(ValueError, match=re.escape("cost must be zero or positive, got -1.5")) as info:
        limiter.hit_sync("k", "10/s", cost=-1.5)
    assert not isinstance(info.value, ConfigurationError)
