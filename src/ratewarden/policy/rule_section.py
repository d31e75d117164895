"""Validator of the policy document's ``[[rules]]``: each table becomes a ``Rule`` (bypass) or a
``PolicyRule`` (a rate or the caller's group's limits, with its key, delay and charge)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..algorithms import ALGORITHMS, unknown_algorithm
from ..charges import Charge
from ..errors import ConfigurationError
from ..keys import KeyFunc, client_ip
from ..rates import parse_rates
from ..rules import Rule, compile_path, http_methods
from .delay import Delay
from .problems import Validator, describe_value
from .sections import parse_duration, spec_key
from .tiers import Identity, PolicyRule, Tiers

__all__ = ["RuleDefaults", "rules_section"]

_RULE = ("path", "name", "methods", "rate", "tiered", "key", "algorithm", "cost", "bypass", "shadow", "delay", "charge")
_DELAY = ("max_wait", "burst", "max_waiting")
_CHARGE = ("statuses",)


@dataclass(frozen=True)
class RuleDefaults:
    """What rules take from the rest of the document."""

    algorithm: str
    identity: Identity | None
    tiers: Tiers | None
    identity_failed: bool  # an [identity] section is there but did not validate
    tiers_failed: bool  # [identity] and [groups] are there but did not both validate


def rules_section(v: Validator, raw: Any, defaults: RuleDefaults) -> list[Rule]:
    """Every valid rule, in order; names must be unique."""
    if not isinstance(raw, list):
        v.error(["rules"], f"expected a list of rules ([[rules]] in TOML), got {describe_value(raw)}")
        return []
    rules: list[Rule] = []
    names: dict[str, int] = {}
    for i, item in enumerate(raw):
        path: list[str | int] = ["rules", i]
        table = v.table(item, path, _RULE)
        if not table:
            continue
        rule = _rule(v, table, path, defaults)
        if rule is not None:
            if rule.name in names:
                where = [*path, "name"] if "name" in table else [*path, "path"]
                v.error(where, f"duplicate rule name {rule.name!r} (also rules[{names[rule.name]}]); names must be unique")
            names[rule.name] = i
            rules.append(rule)
    return rules


def _rule(v: Validator, t: dict[str, Any], path: list[str | int], defaults: RuleDefaults) -> Rule | None:
    before = len(v.problems)
    rule_path = t.get("path")
    if not isinstance(rule_path, str):
        v.error([*path, "path"] if "path" in t else path, "each rule needs a 'path' string such as \"/api/**\"")
        return None
    v.attempt([*path, "path"], lambda: compile_path(rule_path))
    name = v.typed(t, "name", path, str)
    methods = _methods(v, t, path)
    algorithm = v.typed(t, "algorithm", path, str, defaults.algorithm)
    if algorithm not in ALGORITHMS:
        v.error([*path, "algorithm"], unknown_algorithm(algorithm))
    bypass = v.typed(t, "bypass", path, bool, False)
    shadow = v.typed(t, "shadow", path, bool, False)
    tiered = v.typed(t, "tiered", path, bool, False)
    cost = t.get("cost", 1)
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
        v.error([*path, "cost"], f"expected a number >= 0, got {describe_value(cost)}")
        cost = 1
    buildable = _limits(v, t, path, bypass, tiered, defaults)
    key = _key(v, t, path, tiered, defaults)
    delay = _delay(v, t["delay"], [*path, "delay"]) if "delay" in t else None
    charge = _charge(v, t["charge"], [*path, "charge"]) if "charge" in t else None
    if len(v.problems) > before or not buildable:
        return None
    common: dict[str, Any] = {"name": name, "methods": methods, "algorithm": algorithm, "shadow": shadow, "cost": cost}
    if bypass:
        return v.attempt(path, lambda: Rule(rule_path, None, bypass=True, name=name, methods=methods))  # type: ignore[no-any-return]
    if tiered:
        return v.attempt(path, lambda: PolicyRule(rule_path, tiers=defaults.tiers, delay=delay, charge=charge, **common))  # type: ignore[no-any-return]
    rate = t.get("rate")
    return v.attempt(path, lambda: PolicyRule(rule_path, rate, key=key, delay=delay, charge=charge, **common))  # type: ignore[no-any-return]


def _methods(v: Validator, t: dict[str, Any], path: list[str | int]) -> list[str] | None:
    methods = t.get("methods")
    if methods is None:
        return None
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
        v.error([*path, "methods"], "expected a list of HTTP methods such as [\"GET\", \"POST\"]")
        return None
    try:
        http_methods(methods, "rule")
    except ConfigurationError as exc:  # an unknown name ("GETT") would switch the limit off
        v.error([*path, "methods"], str(exc))
        return None
    return methods


def _limits(v: Validator, t: dict[str, Any], path: list[str | int], bypass: bool, tiered: bool, defaults: RuleDefaults) -> bool:
    """Check where the rule's limits come from (``rate``, ``tiered`` or ``bypass``); ``False``
    when the rule cannot be built and the reason was reported elsewhere."""
    rate = t.get("rate")
    if bypass:
        for extra in ("rate", "tiered", "delay", "charge"):
            if extra in t and t[extra] not in (None, False):
                v.error([*path, extra], "a bypass rule has no limits; remove this field or 'bypass'")
    elif tiered:
        if rate is not None:
            v.error([*path, "rate"], "a tiered rule takes its limits from the caller's group; remove 'rate' or 'tiered'")
        if defaults.tiers is None:
            if defaults.tiers_failed:
                return False  # the [identity] or [groups] problems say why
            v.error([*path, "tiered"], "tiered rules need an [identity] section and [groups]")
    elif rate is None:
        v.error(path, "each rule needs 'rate' (e.g. \"100/min\"), 'tiered = true' or 'bypass = true'")
    elif not isinstance(rate, (str, list)):
        v.error([*path, "rate"], f"expected a rate string or a list of them, got {describe_value(rate)}")
    else:
        v.attempt([*path, "rate"], lambda: parse_rates(rate))
    return True


def _key(v: Validator, t: dict[str, Any], path: list[str | int], tiered: bool, defaults: RuleDefaults) -> KeyFunc:
    if "key" not in t:
        return client_ip
    spec = t["key"]
    key: KeyFunc = client_ip
    if not isinstance(spec, str):
        v.error([*path, "key"], f"expected a string such as 'ip' or 'header:X-API-Key', got {describe_value(spec)}")
    else:
        key = spec_key(v, [*path, "key"], spec, defaults.identity, defaults.identity_failed) or client_ip
    if tiered:
        v.error([*path, "key"], "a tiered rule is keyed by the caller's identity; remove 'key'")
    return key


def _delay(v: Validator, raw: Any, path: list[str | int]) -> Delay | None:
    d = v.table(raw, path, _DELAY)
    kwargs: dict[str, Any] = {}
    if "max_wait" in d:
        kwargs["max_wait"] = v.attempt([*path, "max_wait"], lambda: parse_duration(d["max_wait"]))
    for option in ("burst", "max_waiting"):
        if option in d:
            kwargs[option] = v.typed(d, option, path, int)
            if kwargs[option] is not None and kwargs[option] < 1:
                v.error([*path, option], f"must be at least 1, got {kwargs[option]!r}")
                kwargs[option] = None
    if any(x is None for x in kwargs.values()):
        return None
    return v.attempt(path, lambda: Delay(**kwargs))  # type: ignore[no-any-return]


def _charge(v: Validator, raw: Any, path: list[str | int]) -> Charge | None:
    c = v.table(raw, path, _CHARGE)
    statuses = c.get("statuses")
    if not isinstance(statuses, list):
        v.error([*path, "statuses"] if "statuses" in c else path, "expected statuses = [401, \"5xx\", ...]")
        return None
    return v.attempt([*path, "statuses"], lambda: Charge(statuses))  # type: ignore[no-any-return]
