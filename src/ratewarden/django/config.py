"""The ``RATEWARDEN`` setting, read once per process when the middleware or ``@limit`` is first
used (never when ``ratewarden.django`` is imported), and read again when a test changes it
(``override_settings``).

```python
RATEWARDEN = {
    "STORE": "memory://",            # a store URL (ratewarden.stores.open_store), a Store, or your own (stores.protocols)
    "RULES": [{"path": "/api/**", "rate": "100/min", "key": "user_or_ip"}],
    "POLICY": None,                  # a policy file whose rules join RULES
    "ON_ERROR": "open",              # "closed": answer 503 when the store fails
    "TRUSTED_PROXIES": [],           # CIDRs whose X-Forwarded-For is believed
    "HEADERS": "always",             # rate-limit headers: "always", "on_limit" or "off"
    "HEADER_STYLE": "both",          # "ietf", "legacy" or "both"
    "ON_LIMIT": None,                # a view of (request, decision) answering instead of the 429
}
```

A bad value raises ``SettingsError`` (both Django's ``ImproperlyConfigured`` and ratewarden's
``ConfigurationError``) naming the setting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from django.conf import settings  # type: ignore[import-untyped]
from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]
from django.core.signals import setting_changed  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]

from ..decision import Decision
from ..enforcement.answers import HeaderOptions
from ..errors import ConfigurationError
from ..headers import HeaderMode, HeaderStyle
from ..keys import ClientIP
from ..keys import client_ip as default_client_ip
from ..limiter import Limiter
from ..rules import Rule, RuleSet
from ..stores.adapted import as_store
from ..stores.base import Store
from ..stores.urls import check_store_url, open_store
from .keys import django_key

__all__ = ["SETTING", "DjangoConfig", "OnLimit", "SettingsError", "check_config", "current_config", "load_config"]

SETTING = "RATEWARDEN"
"""The name of the Django setting."""

_OPTIONS = (
    "STORE", "RULES", "POLICY", "ON_ERROR", "TRUSTED_PROXIES", "FORWARDED_HEADER", "IPV6_PREFIX",
    "HEADERS", "HEADER_STYLE", "PREFIX", "ENABLED", "ON_LIMIT",
)
OnLimit = Callable[[Any, Decision], Any]
"""``ON_LIMIT``: called with the request and the denying decision; the response it returns (an
``HttpResponse``; under ASGI it may be ``async def``) is sent instead of the 429, ``None`` keeps the 429."""

_RULE_FIELDS = ("path", "rate", "key", "methods", "algorithm", "name", "cost", "bypass", "shadow")


class SettingsError(ImproperlyConfigured, ConfigurationError):  # type: ignore[misc]
    """A ``RATEWARDEN`` setting that cannot be used; the message names it. Both Django's
    ``ImproperlyConfigured`` and ratewarden's ``ConfigurationError``."""


@dataclass(frozen=True)
class DjangoConfig:
    """What the ``RATEWARDEN`` setting builds, shared by the middleware and every ``@limit``.

    Args:
        limiter: Checks the limits on the store of ``STORE``.
        rules: The middleware's rules (``RULES`` and ``POLICY``); ``None`` when there are none.
        client_ip: The ``ip`` key, with ``TRUSTED_PROXIES``.
        headers: ``HEADERS``: when to send the rate-limit headers.
        header_style: ``HEADER_STYLE``: which rate-limit headers.
        on_limit: ``ON_LIMIT``: what answers instead of the 429 (``None``: the 429).
    """

    limiter: Limiter
    rules: RuleSet | None
    client_ip: ClientIP
    headers: HeaderMode
    header_style: HeaderStyle
    on_limit: OnLimit | None = None
    #: ``headers`` and ``header_style`` as every door reads them.
    answers: HeaderOptions = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "answers", HeaderOptions(self.headers, self.header_style))


def _error(option: str, message: str) -> SettingsError:
    return SettingsError(f"{SETTING}[{option!r}]: {message}")


def _choice(values: Mapping[str, Any], option: str, default: str, choices: Sequence[str]) -> Any:
    value = values.get(option, default)
    if value not in choices:
        raise _error(option, f"must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value


def _store(value: object) -> Store:
    """``STORE`` as a ``Store``: a URL opened, a ``Store``, or a store of your own
    (``stores.protocols``) adapted by ``as_store``."""
    if not isinstance(value, str):
        try:
            return as_store(cast(Any, value), "STORE")
        except TypeError:
            raise _error(
                "STORE", "must be a store URL ('memory://', 'shm://name', 'redis://host'), a Store, or an object with "
                f"async hit, peek and reset (ratewarden.stores.protocols.AsyncStore), got {value!r}",
            ) from None
    try:
        return open_store(value)
    except ConfigurationError as exc:
        raise _error("STORE", str(exc)) from None


def _check_store(value: object) -> None:
    """``_store`` without opening anything (``check_config``)."""
    if not isinstance(value, str):
        _store(value)  # adapts, or raises
        return
    try:
        check_store_url(str(value))
    except ConfigurationError as exc:
        raise _error("STORE", str(exc)) from None


def _on_limit(value: object) -> OnLimit | None:
    if value is None:
        return None
    found = value
    if isinstance(value, str):
        try:
            found = import_string(value)
        except ImportError as exc:
            raise _error("ON_LIMIT", f"cannot import {value!r} ({exc})") from None
    if not callable(found):
        raise _error("ON_LIMIT", f"must be a function of (request, decision) or its dotted path, got {value!r}")
    return found


def _client_ip(values: Mapping[str, Any]) -> ClientIP:
    proxies = values.get("TRUSTED_PROXIES", ())
    if isinstance(proxies, str) or not isinstance(proxies, (list, tuple, set, frozenset)):
        raise _error("TRUSTED_PROXIES", f"must be a list of CIDRs such as ['10.0.0.0/8'], got {proxies!r}")
    try:
        return ClientIP(
            proxies,
            ipv6_prefix=values.get("IPV6_PREFIX", 64),
            forwarded_header=values.get("FORWARDED_HEADER", "X-Forwarded-For"),
        )
    except (ConfigurationError, TypeError) as exc:
        option = "TRUSTED_PROXIES" if "proxy" in str(exc) else "IPV6_PREFIX" if "ipv6" in str(exc) else "FORWARDED_HEADER"
        raise _error(option, str(exc)) from None


def _rule(item: object, index: int, client_ip: ClientIP) -> Rule:
    if type(item) is Rule and item.key is default_client_ip:
        return _with_key(item, client_ip)
    if isinstance(item, Rule):
        return item
    if not isinstance(item, Mapping):
        raise _error("RULES", f"item {index} must be a dict such as {{'path': '/api/**', 'rate': '100/min'}} or a Rule, got {item!r}")
    unknown = sorted(set(item) - set(_RULE_FIELDS))
    if unknown:
        raise _error("RULES", f"item {index}: unknown field(s) {', '.join(map(repr, unknown))}; use {', '.join(_RULE_FIELDS)}")
    fields = dict(item)
    try:
        path = fields.pop("path", "/**")
        name = fields.get("name") or (path if isinstance(path, str) else None)
        fields["key"] = django_key(fields.get("key", "ip"), client_ip, name or "")
        return Rule(path, **fields)
    except (ConfigurationError, TypeError) as exc:
        raise _error("RULES", f"item {index}: {exc}") from None


def _with_key(rule: Rule, key: ClientIP) -> Rule:
    """``rule`` charging ``key`` (the settings' ``ip`` key): a ``Rule`` left on the default key follows
    ``TRUSTED_PROXIES`` as a dict rule's ``"ip"`` does."""
    return Rule(
        rule.path, rule.rate, key=key, algorithm=rule.algorithm, methods=rule.methods, bypass=rule.bypass,
        name=rule.name, cost=rule.cost, websocket=rule.websocket, message_rate=rule.message_rate, shadow=rule.shadow,
    )


def _policy_rules(path: object) -> list[Rule]:
    from ..policy.loader import load_policy
    from ..policy.tiers import PolicyRule

    if not isinstance(path, str) and not hasattr(path, "__fspath__"):
        raise _error("POLICY", f"must be the path of a policy file, got {path!r}")
    try:
        policy = load_policy(path)  # type: ignore[arg-type]
    except (ConfigurationError, OSError) as exc:
        raise _error("POLICY", str(exc)) from None
    unsupported = [
        what for what, used in (
            ("[identity]/[groups] tiers", policy.tiers is not None),
            ("[bans]", policy.bans is not None),
            ("settings.shadow", policy.shadow),
            ("a rule's delay or charge", any(
                isinstance(r, PolicyRule) and (r.delay is not None or r.charge is not None) for r in policy.rules
            )),
        ) if used
    ]
    if unsupported:
        raise _error(
            "POLICY",
            f"{path}: {', '.join(unsupported)} need ratewarden.PolicyMiddleware (ASGI); "
            "ratewarden.django enforces a policy's plain rules only",
        )
    return list(policy.rules)


def load_config(values: object) -> DjangoConfig:
    """Build the configuration from the ``RATEWARDEN`` setting's value.

    Args:
        values: The setting (a dict; ``None`` means every default).
    """
    return cast("DjangoConfig", _read(values, open_store=True))


def check_config(values: object) -> None:
    """Raise ``SettingsError`` for what ``load_config`` would refuse, without opening the store
    (the ``manage.py check`` system check, ``checks.py``).

    Args:
        values: The setting (a dict; ``None`` means every default).
    """
    _read(values, open_store=False)


def _read(values: object, *, open_store: bool) -> DjangoConfig | None:
    if values is None:
        values = {}
    if not isinstance(values, Mapping):
        raise SettingsError(f"{SETTING} must be a dict such as {{'STORE': 'memory://'}}, got {values!r}")
    unknown = sorted(set(values) - set(_OPTIONS))
    if unknown:
        raise SettingsError(f"{SETTING}: unknown option(s) {', '.join(map(repr, unknown))}; use {', '.join(_OPTIONS)}")
    on_error = _choice(values, "ON_ERROR", "open", ("open", "closed"))
    headers = _choice(values, "HEADERS", "always", ("always", "on_limit", "off"))
    style = _choice(values, "HEADER_STYLE", "both", ("ietf", "legacy", "both"))
    prefix = values.get("PREFIX", "rw")
    if not isinstance(prefix, str) or not prefix:
        raise _error("PREFIX", f"must be a non-empty string, got {prefix!r}")
    enabled = values.get("ENABLED", True)
    if not isinstance(enabled, bool):
        raise _error("ENABLED", f"must be True or False, got {enabled!r}")
    client_ip = _client_ip(values)
    raw_rules = values.get("RULES", ())
    if isinstance(raw_rules, (str, Mapping)) or not isinstance(raw_rules, Sequence):
        raise _error("RULES", f"must be a list of rules, got {raw_rules!r}")
    rules = [_rule(item, index, client_ip) for index, item in enumerate(raw_rules)]
    if values.get("POLICY") is not None:
        rules.extend(_policy_rules(values["POLICY"]))
    on_limit = _on_limit(values.get("ON_LIMIT"))
    if not open_store:
        _check_store(values.get("STORE", "memory://"))
        return None
    limiter = Limiter(_store(values.get("STORE", "memory://")), prefix=prefix, on_error=on_error, enabled=enabled)
    return DjangoConfig(limiter, RuleSet(rules, limiter.prefix) if rules else None, client_ip, headers, style, on_limit)


_lock = threading.Lock()
_current: list[DjangoConfig] = []


def current_config() -> DjangoConfig:
    """The configuration of ``settings.RATEWARDEN``, built on first use and kept for the process
    (built again after ``override_settings`` changes it)."""
    if _current:
        return _current[0]
    with _lock:
        if not _current:
            _current.append(load_config(getattr(settings, SETTING, None)))
        return _current[0]


def _forget(*, setting: str, **_: object) -> None:
    if setting == SETTING:
        with _lock:
            _current.clear()


setting_changed.connect(_forget, dispatch_uid="ratewarden.django.config")
