"""The policy file's schema: validation of the parsed document into a ``Policy``, with every
problem reported as ``file:line: field: message``.

Document layout (TOML shown; YAML has the same structure)::

    version = 1
    [settings]   algorithm, shadow, show_group, headers, store
    [identity]   sources, unknown_group, anonymous_group, keys, hashed_keys, patterns
    [groups.<name>]  limits = ["10/s", "500/min"]  |  unlimited = true
    [[rules]]    path, name, methods, rate | tiered, key, algorithm, cost, bypass, shadow,
                 delay = {max_wait, burst, max_waiting}, charge = {statuses}
    [bans]       after, within, duration, growth, max_duration, status, key
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..algorithms import ALGORITHMS
from ..bans import Bans
from ..charges import Charge
from ..delay import Delay
from ..keys import KeyFunc, bearer_token, client_ip, header, query_param
from ..rates import parse_rates
from ..rules import Rule, compile_path
from ..stores.base import Store
from ..stores.memory import MemoryStore
from ..stores.urls import check_store_url, open_store
from .tiers import Identity, PolicyRule, Tiers, parse_source

__all__ = ["Policy", "PolicyError", "Problem", "validate"]

Locate = Callable[[Sequence[str | int]], "int | None"]

_TOP = ("version", "settings", "identity", "groups", "rules", "bans")
_SETTINGS = ("algorithm", "shadow", "show_group", "store")
_IDENTITY = ("sources", "unknown_group", "anonymous_group", "keys", "hashed_keys", "patterns")
_GROUP = ("limits", "unlimited")
_RULE = ("path", "name", "methods", "rate", "tiered", "key", "algorithm", "cost", "bypass", "shadow", "delay", "charge")
_DELAY = ("max_wait", "burst", "max_waiting")
_CHARGE = ("statuses",)
_BANS = ("after", "within", "duration", "growth", "max_duration", "status", "key", "cache_for")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a policy file."""

    field: str
    message: str
    line: int | None = None
    source: str = "<policy>"

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line else self.source
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


class PolicyError(ValueError):
    """A policy file that cannot be used; ``problems`` lists every issue found."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass
class Policy:
    """A validated policy, ready to build rules from."""

    rules: list[Rule]
    tiers: Tiers | None = None
    bans: Bans | None = None
    shadow: bool = False
    show_group: bool = True
    algorithm: str = "fixed_window"
    source: str = "<policy>"
    data: dict[str, Any] = field(default_factory=dict)
    store: str | None = None  # settings.store: a store URL (shm://api, redis://..), None = MemoryStore

    def make_store(self) -> Store:
        """The store ``settings.store`` names (a ``MemoryStore`` when it names none); build the
        ``Limiter`` with it. It is read once: changing it takes a restart, not a reload."""
        if self.store is None:
            return MemoryStore()
        return open_store(self.store)

    def describe(self) -> list[str]:
        """Human-readable lines: the effective rules, groups and modes."""
        out = [f"policy {self.source}: {len(self.rules)} rule(s)" + (", shadow mode" if self.shadow else "")]
        for rule in self.rules:
            out.append("  " + describe_rule(rule))
        if self.tiers is not None:
            out.append("groups:")
            for group, rates in self.tiers.groups.items():
                text = "unlimited" if rates is None else "; ".join(str(r) for r in parse_rates(rates))
                out.append(f"  {group}: {text}")
            ident = self.tiers.identity
            out.append(
                f"identity: sources {', '.join(ident.sources)}; unknown keys -> {ident.unknown_group}; "
                f"no key -> {ident.anonymous_group}; {len(ident.keys)} key(s), {len(ident.hashed_keys)} hashed, "
                f"{len(ident.patterns)} pattern(s)"
            )
        if self.bans is not None:
            b = self.bans
            out.append(
                f"bans: after {b.after} rejections in {b.within:g}s, ban {b.duration:g}s"
                f" (x{b.growth:g} per repeat, max {b.max_duration:g}s), answered {b.status}"
            )
        return out


def describe_rule(rule: Rule) -> str:
    methods = ",".join(sorted(rule.methods)) if rule.methods else "*"
    if rule.bypass:
        what = "bypass (no limits)"
    elif isinstance(rule, PolicyRule) and rule.tiers is not None:
        what = "limits of the caller's group"
    else:
        what = "; ".join(str(limit.rate) for limit in rule.limits)
    extras = [rule.algorithm] if not rule.bypass else []
    if rule.shadow:
        extras.append("shadow")
    if isinstance(rule, PolicyRule):
        if rule.delay is not None:
            extras.append(f"delay up to {rule.delay.max_wait:g}s (burst {rule.delay.burst})")
        if rule.charge is not None:
            extras.append(f"counts only statuses {', '.join(str(s) for s in rule.charge.spec)}")
    suffix = f" [{', '.join(extras)}]" if extras else ""
    return f"{rule.name}: {methods} {rule.path}: {what}{suffix}"


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like ``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration (seconds or '30s', '5m', '1h'), got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ValueError(f"expected a duration (seconds or '30s', '5m', '1h'), got {value!r}")
    if not seconds > 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    return seconds


class _Validator:
    def __init__(self, locate: Locate, source: str) -> None:
        self.locate = locate
        self.source = source
        self.problems: list[Problem] = []

    def error(self, path: Sequence[str | int], message: str) -> None:
        line = None
        probe = list(path)
        while line is None and probe:
            line = self.locate(probe)
            probe.pop()
        self.problems.append(Problem(_field_name(path), message, line, self.source))

    def table(self, value: Any, path: list[str | int], allowed: Sequence[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.error(path, f"expected a table/mapping, got {_kind(value)}")
            return {}
        for name in value:
            if name not in allowed:
                hint = difflib.get_close_matches(str(name), allowed, n=1)
                suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
                self.error([*path, str(name)], f"unknown field{suggestion}; expected one of: {', '.join(allowed)}")
        return dict(value)

    def typed(self, table: Mapping[str, Any], name: str, path: list[str | int], kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = table.get(name, default)
        if value is default:
            return value
        if isinstance(value, bool) and kind is not bool and (not isinstance(kind, tuple) or bool not in kind):
            self.error([*path, name], f"expected {_type_name(kind)}, got {_kind(value)}")
            return default
        if not isinstance(value, kind):
            self.error([*path, name], f"expected {_type_name(kind)}, got {_kind(value)}")
            return default
        return value

    def attempt(self, path: list[str | int], fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except (ValueError, TypeError) as exc:
            self.error(path, str(exc))
            return None


def _field_name(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def _key_function(spec: str, identity: Identity | None) -> KeyFunc:
    """``ip``, ``identity``, ``header:<Name>``, ``bearer`` or ``query:<name>``."""
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    arg = arg.strip()
    if kind == "ip" and not arg:
        return client_ip
    if kind == "identity" and not arg:
        if identity is None:
            raise ValueError("key 'identity' needs an [identity] section")
        return identity.key
    if kind == "header" and arg:
        return header(arg)
    if kind == "bearer" and not arg:
        return bearer_token()
    if kind == "query" and arg:
        return query_param(arg)
    raise ValueError(f"invalid key {spec!r}: use 'ip', 'identity', 'header:<Name>', 'bearer' or 'query:<name>'")


def _store_url(url: str) -> str:
    check_store_url(url)
    return url


def validate(data: Any, locate: Locate = lambda path: None, source: str = "<policy>") -> Policy:
    """Check a parsed policy document and build the ``Policy``; raises ``PolicyError`` listing
    every problem (with line numbers when ``locate`` can find them)."""
    v = _Validator(locate, source)
    if not isinstance(data, Mapping):
        raise PolicyError([Problem("", f"the policy must be a table/mapping at the top level, got {_kind(data)}", None, source)])
    top = v.table(data, [], _TOP)
    version = top.get("version", 1)
    if version != 1:
        v.error(["version"], f"unsupported version {version!r}; this ratewarden reads version 1")

    settings = v.table(top.get("settings"), ["settings"], _SETTINGS)
    algorithm = v.typed(settings, "algorithm", ["settings"], str, "fixed_window")
    if algorithm not in ALGORITHMS:
        v.error(["settings", "algorithm"], f"unknown algorithm {algorithm!r}; choose one of: {', '.join(ALGORITHMS)}")
        algorithm = "fixed_window"
    shadow = v.typed(settings, "shadow", ["settings"], bool, False)
    show_group = v.typed(settings, "show_group", ["settings"], bool, True)
    store = v.typed(settings, "store", ["settings"], str)
    if store is not None:
        store = v.attempt(["settings", "store"], _store_url, store)

    # Groups
    groups: dict[str, Any] = {}
    raw_groups = v.table(top.get("groups"), ["groups"], [str(k) for k in (top.get("groups") or {})] if isinstance(top.get("groups"), Mapping) else [])
    for name, spec in raw_groups.items():
        path: list[str | int] = ["groups", name]
        if not isinstance(spec, Mapping):
            # Short form: premium = ["100/s", "5000/min"] or premium = "unlimited"
            spec = {"unlimited": True} if spec == "unlimited" else {"limits": spec}
        table = v.table(spec, path, _GROUP)
        if table.get("unlimited") is True:
            if "limits" in table:
                v.error([*path, "limits"], "a group is either unlimited or has limits, not both")
            groups[name] = None
            continue
        if "unlimited" in table and table["unlimited"] is not False:
            v.error([*path, "unlimited"], f"expected true or false, got {_kind(table['unlimited'])}")
        limits = table.get("limits")
        if limits is None:
            v.error(path, "needs 'limits' (e.g. limits = [\"10/s\", \"500/min\"]) or 'unlimited = true'")
            continue
        if not isinstance(limits, (str, list)) or (isinstance(limits, list) and not all(isinstance(x, str) for x in limits)):
            v.error([*path, "limits"], f"expected a rate string or a list of them, got {_kind(limits)}")
            continue
        parsed = v.attempt([*path, "limits"], parse_rates, limits)
        if parsed is not None:
            groups[name] = parsed

    # Identity
    identity: Identity | None = None
    if "identity" in top:
        ident = v.table(top["identity"], ["identity"], _IDENTITY)
        sources = ident.get("sources", ["header:X-API-Key"])
        if isinstance(sources, str):
            sources = [sources]
        if not isinstance(sources, list) or not sources:
            v.error(["identity", "sources"], "expected a non-empty list such as [\"header:X-API-Key\", \"bearer\", \"query:api_key\"]")
            sources = ["header:X-API-Key"]
        for i, src in enumerate(sources):
            if not isinstance(src, str):
                v.error(["identity", "sources", i], f"expected a string, got {_kind(src)}")
            else:
                v.attempt(["identity", "sources", i], parse_source, src)
        maps: dict[str, dict[str, str]] = {}
        for section in ("keys", "hashed_keys", "patterns"):
            table = ident.get(section) or {}
            if not isinstance(table, Mapping):
                v.error(["identity", section], f"expected a table of key = \"group\", got {_kind(table)}")
                table = {}
            clean: dict[str, str] = {}
            for k, g in table.items():
                if not isinstance(g, str):
                    v.error(["identity", section, str(k)], f"expected a group name, got {_kind(g)}")
                elif g not in groups and g not in raw_groups:
                    v.error(["identity", section, str(k)], f"unknown group {g!r}; defined groups: {', '.join(raw_groups) or 'none'}")
                else:
                    clean[str(k)] = g
            if section == "hashed_keys":
                for k in clean:
                    if not re.fullmatch(r"[0-9a-fA-F]{64}", k):
                        v.error(["identity", section, k], "expected a SHA-256 hex digest (64 hex characters)")
            maps[section] = clean
        fallback: dict[str, str] = {}
        for name in ("unknown_group", "anonymous_group"):
            g = ident.get(name)
            if not isinstance(g, str):
                v.error(["identity", name] if name in ident else ["identity"], f"'{name}' must name a group (it is required)")
            elif g not in raw_groups:
                v.error(["identity", name], f"unknown group {g!r}; defined groups: {', '.join(raw_groups) or 'none'}")
            else:
                fallback[name] = g
        if not v.problems:
            identity = v.attempt(
                ["identity"],
                lambda: Identity(
                    sources,
                    keys=maps["keys"],
                    hashed_keys=maps["hashed_keys"],
                    patterns=maps["patterns"],
                    unknown_group=fallback["unknown_group"],
                    anonymous_group=fallback["anonymous_group"],
                ),
            )
    tiers: Tiers | None = None
    if identity is not None and groups:
        tiers = v.attempt(["groups"], lambda: Tiers(groups, identity))

    # Rules
    rules: list[Rule] = []
    raw_rules = top.get("rules", [])
    if not isinstance(raw_rules, list):
        v.error(["rules"], f"expected a list of rules ([[rules]] in TOML), got {_kind(raw_rules)}")
        raw_rules = []
    names: dict[str, int] = {}
    for i, raw in enumerate(raw_rules):
        path = ["rules", i]
        rule_table = v.table(raw, path, _RULE)
        if not rule_table:
            continue
        rule = _rule(v, rule_table, path, algorithm, identity, tiers, groups)
        if rule is not None:
            if rule.name in names:
                v.error([*path, "name"] if "name" in rule_table else [*path, "path"], f"duplicate rule name {rule.name!r} (also rules[{names[rule.name]}]); names must be unique")
            names[rule.name] = i
            rules.append(rule)

    # Bans
    bans: Bans | None = None
    if "bans" in top:
        b = v.table(top["bans"], ["bans"], _BANS)
        kwargs: dict[str, Any] = {}
        for name in ("within", "duration", "max_duration", "cache_for"):
            if name in b:
                kwargs[name] = v.attempt(["bans", name], parse_duration, b[name])
        for name, kind in (("after", int), ("status", int), ("growth", (int, float))):
            if name in b:
                kwargs[name] = v.typed(b, name, ["bans"], kind)
        if "key" in b:
            key_spec = v.typed(b, "key", ["bans"], str)
            if key_spec is not None:
                kwargs["key"] = v.attempt(["bans", "key"], lambda: _key_function(key_spec, identity))
        if not any(value is None for value in kwargs.values()):
            bans = v.attempt(["bans"], lambda: Bans(**kwargs))

    if v.problems:
        raise PolicyError(v.problems)
    return Policy(rules, tiers, bans, shadow, show_group, algorithm, source, dict(data), store)


def _rule(
    v: _Validator,
    t: dict[str, Any],
    path: list[str | int],
    default_algorithm: str,
    identity: Identity | None,
    tiers: Tiers | None,
    groups: Mapping[str, Any],
) -> Rule | None:
    before = len(v.problems)
    rule_path = t.get("path")
    if not isinstance(rule_path, str):
        v.error([*path, "path"] if "path" in t else path, "each rule needs a 'path' string such as \"/api/**\"")
        return None
    v.attempt([*path, "path"], lambda: compile_path(rule_path))
    name = v.typed(t, "name", path, str)
    methods = t.get("methods")
    if methods is not None:
        if isinstance(methods, str):
            methods = [methods]
        if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
            v.error([*path, "methods"], "expected a list of HTTP methods such as [\"GET\", \"POST\"]")
            methods = None
    algorithm = v.typed(t, "algorithm", path, str, default_algorithm)
    if algorithm not in ALGORITHMS:
        v.error([*path, "algorithm"], f"unknown algorithm {algorithm!r}; choose one of: {', '.join(ALGORITHMS)}")
    bypass = v.typed(t, "bypass", path, bool, False)
    shadow = v.typed(t, "shadow", path, bool, False)
    tiered = v.typed(t, "tiered", path, bool, False)
    rate = t.get("rate")
    cost = t.get("cost", 1)
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
        v.error([*path, "cost"], f"expected a number >= 0, got {_kind(cost)}")
        cost = 1
    if bypass:
        for extra in ("rate", "tiered", "delay", "charge"):
            if extra in t and t[extra] not in (None, False):
                v.error([*path, extra], "a bypass rule has no limits; remove this field or 'bypass'")
    elif tiered:
        if rate is not None:
            v.error([*path, "rate"], "a tiered rule takes its limits from the caller's group; remove 'rate' or 'tiered'")
        if tiers is None:
            v.error([*path, "tiered"], "tiered rules need an [identity] section and [groups]")
    elif rate is None:
        v.error(path, "each rule needs 'rate' (e.g. \"100/min\"), 'tiered = true' or 'bypass = true'")
    elif not isinstance(rate, (str, list)):
        v.error([*path, "rate"], f"expected a rate string or a list of them, got {_kind(rate)}")
    else:
        v.attempt([*path, "rate"], lambda: parse_rates(rate))
    key: KeyFunc = client_ip
    if "key" in t:
        key_spec = t["key"]
        if not isinstance(key_spec, str):
            v.error([*path, "key"], f"expected a string such as 'ip' or 'header:X-API-Key', got {_kind(key_spec)}")
        else:
            key = v.attempt([*path, "key"], lambda: _key_function(key_spec, identity)) or client_ip
        if tiered:
            v.error([*path, "key"], "a tiered rule is keyed by the caller's identity; remove 'key'")
    delay = None
    if "delay" in t:
        d = v.table(t["delay"], [*path, "delay"], _DELAY)
        kwargs: dict[str, Any] = {}
        if "max_wait" in d:
            kwargs["max_wait"] = v.attempt([*path, "delay", "max_wait"], lambda: parse_duration(d["max_wait"]))
        for option in ("burst", "max_waiting"):
            if option in d:
                kwargs[option] = v.typed(d, option, [*path, "delay"], int)
        if not any(x is None for x in kwargs.values()):
            delay = v.attempt([*path, "delay"], lambda: Delay(**kwargs))
    charge = None
    if "charge" in t:
        c = v.table(t["charge"], [*path, "charge"], _CHARGE)
        statuses = c.get("statuses")
        if not isinstance(statuses, list):
            v.error([*path, "charge", "statuses"] if "statuses" in c else [*path, "charge"], "expected statuses = [401, \"5xx\", ...]")
        else:
            charge = v.attempt([*path, "charge", "statuses"], lambda: Charge(statuses))
    if len(v.problems) > before:
        return None
    common: dict[str, Any] = {"name": name, "methods": methods, "algorithm": algorithm, "shadow": shadow, "cost": cost}
    if bypass:
        return v.attempt(path, lambda: Rule(rule_path, None, bypass=True, name=name, methods=methods))  # type: ignore[no-any-return]
    if tiered:
        return v.attempt(path, lambda: PolicyRule(rule_path, tiers=tiers, delay=delay, charge=charge, **common))  # type: ignore[no-any-return]
    return v.attempt(path, lambda: PolicyRule(rule_path, rate, key=key, delay=delay, charge=charge, **common))  # type: ignore[no-any-return]
