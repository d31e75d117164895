"""The extension's settings for one Flask app: the ``RateLimiter(...)`` arguments, else the
``RATEWARDEN_*`` keys of ``app.config``, else the defaults (``read_settings``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from ..algorithms import AlgorithmName, algorithm_name
from ..enforcement.answers import HeaderOptions
from ..errors import ConfigurationError
from ..headers import HeaderMode, HeaderStyle
from ..keys import ClientIP, KeyFunc, client_ip
from ..limiter import FailurePolicy, Limiter
from ..limits import DEFAULT_ALGORITHM
from ..rates import Rate
from ..stores.urls import open_store

__all__ = ["CONFIG_KEYS", "FLASK_LIMITER_KEYS", "RateSpec", "ResetFormat", "Settings", "check_keys", "read_settings"]

RateSpec = str | Rate | Iterable[str | Rate]
"""One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them."""

ResetFormat = Literal["seconds", "epoch"]
"""What ``X-RateLimit-Reset`` holds: seconds until more quota (``"seconds"``, the draft's ``t``) or
that moment as a Unix time (``"epoch"``, flask-limiter's)."""

CONFIG_KEYS = {
    "RATEWARDEN_ENABLED": "False turns the extension off (every request passes, no headers).",
    "RATEWARDEN_STORAGE_URL": "The store's URL, opened with ratewarden.stores.open_store (default memory://).",
    "RATEWARDEN_KEY_PREFIX": "The limiter's storage-key prefix (default rw).",
    "RATEWARDEN_ON_ERROR": "open (default) or closed: the limiter's failure policy.",
    "RATEWARDEN_DEFAULT_LIMITS": "Rates for every view without limits of its own, counted per view.",
    "RATEWARDEN_APPLICATION_LIMITS": "Rates for every request, one counter across the whole app.",
    "RATEWARDEN_ALGORITHM": "The algorithm of limits that name none (default fixed_window).",
    "RATEWARDEN_HEADERS": "always (default), on_limit or off (True and False also work).",
    "RATEWARDEN_HEADER_STYLE": "both (default), ietf or legacy.",
    "RATEWARDEN_HEADER_RESET": "seconds (default) or epoch: X-RateLimit-Reset as seconds left or as a Unix time (flask-limiter's).",
    "RATEWARDEN_TRUSTED_PROXIES": "CIDRs whose forwarding header the default key believes (a list, or comma-separated).",
    "RATEWARDEN_FORWARDED_HEADER": "X-Forwarded-For (default) or Forwarded: the header those proxies set.",
}
"""Every ``app.config`` key the extension reads, with what it means."""

FLASK_LIMITER_KEYS = {
    "RATELIMIT_ENABLED": "RATEWARDEN_ENABLED",
    "RATELIMIT_STORAGE_URI": "RATEWARDEN_STORAGE_URL",
    "RATELIMIT_STORAGE_URL": "RATEWARDEN_STORAGE_URL",
    "RATELIMIT_STORAGE_OPTIONS": "the query options of RATEWARDEN_STORAGE_URL (?timeout=0.05&pool_size=20)",
    "RATELIMIT_KEY_PREFIX": "RATEWARDEN_KEY_PREFIX",
    "RATELIMIT_KEY_FUNC": "RateLimiter(key=...)",
    "RATELIMIT_DEFAULT": "RATEWARDEN_DEFAULT_LIMITS",
    "RATELIMIT_GLOBAL": "RATEWARDEN_DEFAULT_LIMITS",
    "RATELIMIT_APPLICATION": "RATEWARDEN_APPLICATION_LIMITS",
    "RATELIMIT_STRATEGY": "RATEWARDEN_ALGORITHM",
    "RATELIMIT_HEADERS_ENABLED": "RATEWARDEN_HEADERS",
    "RATELIMIT_SWALLOW_ERRORS": "RATEWARDEN_ON_ERROR",
    "RATELIMIT_ON_BREACH_CALLBACK": "RateLimiter(on_limit=...)",
    "RATELIMIT_IN_MEMORY_FALLBACK": "RateLimiter(limiter=Limiter(store, fallback=...))",
    "RATELIMIT_IN_MEMORY_FALLBACK_ENABLED": "RateLimiter(limiter=Limiter(store, fallback=...))",
    "RATELIMIT_FAIL_ON_FIRST_BREACH": "nothing: one all-or-nothing check is always made",
    **{
        f"RATELIMIT_HEADER_{part}": "RATEWARDEN_HEADER_STYLE (the names are fixed: ietf or legacy X-RateLimit-*)"
        for part in ("LIMIT", "REMAINING", "RETRY_AFTER", "RETRY_AFTER_VALUE")
    },
    "RATELIMIT_HEADER_RESET": (
        "RATEWARDEN_HEADER_STYLE (the names are fixed: ietf or legacy X-RateLimit-*); "
        "RATEWARDEN_HEADER_RESET = 'epoch' gives X-RateLimit-Reset as flask-limiter's Unix time"
    ),
}
"""flask-limiter's ``RATELIMIT_*`` keys, each with what replaces it; the others have no equivalent
(docs/flask.md, "Migrating from flask-limiter")."""

_LIMITER_KEYS = ("RATEWARDEN_STORAGE_URL", "RATEWARDEN_KEY_PREFIX", "RATEWARDEN_ON_ERROR")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    """What the extension does in one app.

    Args:
        limiter: Checks the limits on its store.
        enabled: Whether requests are checked at all.
        key: Who a limit without a ``key`` of its own charges.
        algorithm: The algorithm of limits that name none.
        default_limits: Rates for each view without limits of its own (``None``: none).
        application_limits: Rates for every request, one counter (``None``: none).
        headers: When the rate-limit headers are sent: ``"always"``, ``"on_limit"`` or ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` or ``"legacy"``.
        header_reset: What ``X-RateLimit-Reset`` holds: ``"seconds"`` left or the ``"epoch"`` time.
    """

    limiter: Limiter
    enabled: bool
    key: KeyFunc
    algorithm: AlgorithmName
    default_limits: RateSpec | None
    application_limits: RateSpec | None
    headers: HeaderMode
    header_style: HeaderStyle
    header_reset: ResetFormat = "seconds"
    #: ``headers`` and ``header_style`` as every door reads them.
    answers: HeaderOptions = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "answers", HeaderOptions(self.headers, self.header_style))


def _flag(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE
    raise ConfigurationError(f"{name} must be True or False, got {value!r}")


def _header_mode(value: object) -> HeaderMode:
    if value is True:
        return "always"
    if value is False:
        return "off"
    if value not in get_args(HeaderMode):
        raise ConfigurationError(f"RATEWARDEN_HEADERS / headers= must be 'always', 'on_limit' or 'off', got {value!r}")
    return cast("HeaderMode", value)


def _header_style(value: object) -> HeaderStyle:
    if value not in get_args(HeaderStyle):
        raise ConfigurationError(f"RATEWARDEN_HEADER_STYLE / header_style= must be 'both', 'ietf' or 'legacy', got {value!r}")
    return cast("HeaderStyle", value)


def _header_reset(value: object) -> ResetFormat:
    if value not in get_args(ResetFormat):
        raise ConfigurationError(
            f"RATEWARDEN_HEADER_RESET / header_reset= must be 'seconds' or 'epoch' (what X-RateLimit-Reset "
            f"holds; its name is fixed), got {value!r}"
        )
    return cast("ResetFormat", value)


def check_keys(config: Mapping[str, Any]) -> None:
    """Refuse the ``RATEWARDEN_*`` keys the extension does not read (a typo would otherwise leave the
    app on its defaults without a word) and flask-limiter's ``RATELIMIT_*`` keys, naming what
    replaces each.

    Args:
        config: The app's ``app.config``.
    """
    problems = []
    for name in sorted(k for k in config if isinstance(k, str)):
        if name.startswith("RATEWARDEN_") and name not in CONFIG_KEYS:
            close = difflib.get_close_matches(name, CONFIG_KEYS, n=1, cutoff=0.8)
            hint = f"did you mean {close[0]}?" if close else f"the keys are {', '.join(CONFIG_KEYS)}"
            problems.append(f"{name}: not a ratewarden key; {hint}")
        elif name.startswith("RATELIMIT_"):
            instead = FLASK_LIMITER_KEYS.get(name)
            hint = f"use {instead}" if instead else "ratewarden has no equivalent (docs/flask.md, \"Migrating from flask-limiter\")"
            problems.append(f"{name}: a flask-limiter key, which ratewarden does not read; {hint}")
    if problems:
        raise ConfigurationError("app.config has keys ratewarden.flask does not read:\n  " + "\n  ".join(problems))


def _default_key(config: Mapping[str, Any]) -> KeyFunc:
    proxies = config.get("RATEWARDEN_TRUSTED_PROXIES")
    header = config.get("RATEWARDEN_FORWARDED_HEADER")
    if not proxies and header is None:
        return client_ip
    if isinstance(proxies, str):
        proxies = [p.strip() for p in proxies.split(",") if p.strip()]
    return ClientIP(trusted_proxies=proxies or (), forwarded_header=header or "X-Forwarded-For")


def _limiter(config: Mapping[str, Any], limiter: Limiter | None) -> Limiter:
    if limiter is not None:
        given = [name for name in _LIMITER_KEYS if config.get(name) is not None]
        if given:
            raise ConfigurationError(
                f"RateLimiter(limiter=...) was given and app.config sets {', '.join(given)} too: configure "
                "the Limiter you pass, or leave limiter= out and let the config build it"
            )
        return limiter
    url = config.get("RATEWARDEN_STORAGE_URL") or "memory://"
    on_error = config.get("RATEWARDEN_ON_ERROR") or "open"
    if on_error not in ("open", "closed"):
        raise ConfigurationError(f"RATEWARDEN_ON_ERROR must be 'open' or 'closed', got {on_error!r}")
    prefix = str(config.get("RATEWARDEN_KEY_PREFIX") or "rw")
    return Limiter(open_store(str(url)), prefix=prefix, on_error=cast("FailurePolicy", on_error))


def read_settings(
    config: Mapping[str, Any],
    *,
    limiter: Limiter | None = None,
    key: KeyFunc | None = None,
    algorithm: AlgorithmName | None = None,
    default_limits: RateSpec | None = None,
    application_limits: RateSpec | None = None,
    headers: HeaderMode | bool | None = None,
    header_style: HeaderStyle | None = None,
    header_reset: ResetFormat | None = None,
    enabled: bool | None = None,
) -> Settings:
    """The settings of one app: each argument given (not ``None``) wins over its config key. A
    ``RATEWARDEN_*`` key it does not know, or a flask-limiter ``RATELIMIT_*`` key, is refused
    (``check_keys``).

    Args:
        config: The app's ``app.config``.
        limiter: The limiter to use; ``None`` builds one from ``RATEWARDEN_STORAGE_URL``,
            ``RATEWARDEN_KEY_PREFIX`` and ``RATEWARDEN_ON_ERROR`` (which must then be unset here).
        key: The default key function (of the scope); ``None``: the client IP, behind
            ``RATEWARDEN_TRUSTED_PROXIES`` if set.
        algorithm: The default algorithm; ``None``: ``RATEWARDEN_ALGORITHM`` or ``"fixed_window"``.
        default_limits: ``None``: ``RATEWARDEN_DEFAULT_LIMITS``.
        application_limits: ``None``: ``RATEWARDEN_APPLICATION_LIMITS``.
        headers: ``None``: ``RATEWARDEN_HEADERS`` or ``"always"``.
        header_style: ``None``: ``RATEWARDEN_HEADER_STYLE`` or ``"both"``.
        header_reset: ``None``: ``RATEWARDEN_HEADER_RESET`` or ``"seconds"``.
        enabled: ``None``: ``RATEWARDEN_ENABLED`` or ``True``.
    """
    check_keys(config)
    chosen_algorithm = algorithm or config.get("RATEWARDEN_ALGORITHM") or DEFAULT_ALGORITHM
    return Settings(
        limiter=_limiter(config, limiter),
        enabled=_flag(enabled if enabled is not None else config.get("RATEWARDEN_ENABLED", True), "RATEWARDEN_ENABLED"),
        key=key if key is not None else _default_key(config),
        algorithm=algorithm_name(str(chosen_algorithm)),
        default_limits=default_limits if default_limits is not None else config.get("RATEWARDEN_DEFAULT_LIMITS") or None,
        application_limits=(
            application_limits if application_limits is not None else config.get("RATEWARDEN_APPLICATION_LIMITS") or None
        ),
        headers=_header_mode(headers if headers is not None else config.get("RATEWARDEN_HEADERS", "always")),
        header_style=_header_style(header_style or config.get("RATEWARDEN_HEADER_STYLE") or "both"),
        header_reset=_header_reset(header_reset or config.get("RATEWARDEN_HEADER_RESET") or "seconds"),
    )
