"""Validators of the policy document's sections other than ``[settings]``: ``[groups]``,
``[identity]``, ``[bans]`` here, ``[[rules]]`` in ``rule_section.py``. Each reports its problems
to the ``Validator`` and returns what it could build (``None`` when the section is unusable).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigurationError
from ..keys import KeyFunc
from ..rates import parse_rates
from .bans import Bans
from .keyspec import key_function, parse_key_spec, parse_source
from .problems import Validator, describe_value
from .tiers import Identity

__all__ = ["Groups", "bans_section", "groups_section", "identity_section", "parse_duration", "spec_key"]

_IDENTITY = ("sources", "unknown_group", "anonymous_group", "keys", "hashed_keys", "patterns")
_GROUP = ("limits", "unlimited")
_BANS = ("after", "within", "duration", "growth", "max_duration", "status", "key", "cache_for")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Seconds from a number or a string like ``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"``."""
    if isinstance(value, bool):
        raise ConfigurationError(f"expected a duration (seconds or '30s', '5m', '1h'), got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ConfigurationError(f"expected a duration (seconds or '30s', '5m', '1h'), got {value!r}")
    if not seconds > 0:
        raise ConfigurationError(f"duration must be positive, got {value!r}")
    return seconds


class Groups:
    """The ``[groups]`` section: ``limits`` (name -> its rates as written, ``None`` = unlimited) for the
    groups that validated, ``declared`` for every name written, ``valid`` when all validated."""

    def __init__(self, limits: dict[str, Any], declared: dict[str, Any], valid: bool) -> None:
        self.limits = limits
        self.declared = declared
        self.valid = valid


def groups_section(v: Validator, raw: Any) -> Groups:
    before = len(v.problems)
    names = [str(k) for k in raw] if isinstance(raw, Mapping) else []
    declared = v.table(raw, ["groups"], names)
    limits: dict[str, Any] = {}
    for name, spec in declared.items():
        path: list[str | int] = ["groups", name]
        if not isinstance(spec, Mapping):
            # Short form: premium = ["100/s", "5000/min"] or premium = "unlimited"
            spec = {"unlimited": True} if spec == "unlimited" else {"limits": spec}
        table = v.table(spec, path, _GROUP)
        if table.get("unlimited") is True:
            if "limits" in table:
                v.error([*path, "limits"], "a group is either unlimited or has limits, not both")
            limits[name] = None
            continue
        if "unlimited" in table and table["unlimited"] is not False:
            v.error([*path, "unlimited"], f"expected true or false, got {describe_value(table['unlimited'])}")
        rates = table.get("limits")
        if rates is None:
            v.error(path, "needs 'limits' (e.g. limits = [\"10/s\", \"500/min\"]) or 'unlimited = true'")
            continue
        if not isinstance(rates, (str, list)) or (isinstance(rates, list) and not all(isinstance(x, str) for x in rates)):
            v.error([*path, "limits"], f"expected a rate string or a list of them, got {describe_value(rates)}")
            continue
        parsed = v.attempt([*path, "limits"], parse_rates, rates)
        if parsed is not None:  # kept as written: limits are named with their rates (api.premium-100/s)
            limits[name] = rates if isinstance(rates, str) else tuple(rates)
    return Groups(limits, declared, len(v.problems) == before)


def identity_section(v: Validator, raw: Any, groups: Groups) -> Identity | None:
    """The ``[identity]`` section, built when it has no problem of its own."""
    before = len(v.problems)
    ident = v.table(raw, ["identity"], _IDENTITY)
    sources = _sources(v, ident.get("sources", ["header:X-API-Key"]))
    maps = {section: _group_map(v, ident, section, groups) for section in ("keys", "hashed_keys", "patterns")}
    fallback: dict[str, str] = {}
    for name in ("unknown_group", "anonymous_group"):
        g = ident.get(name)
        if not isinstance(g, str):
            v.error(["identity", name] if name in ident else ["identity"], f"'{name}' must name a group (it is required)")
        elif g not in groups.declared:
            v.error(["identity", name], f"unknown group {g!r}; defined groups: {', '.join(groups.declared) or 'none'}")
        else:
            fallback[name] = g
    if len(v.problems) > before:
        return None
    return v.attempt(  # type: ignore[no-any-return]
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


def _sources(v: Validator, sources: Any) -> list[str]:
    if isinstance(sources, str):
        sources = [sources]
    if not isinstance(sources, list) or not sources:
        v.error(["identity", "sources"], "expected a non-empty list such as [\"header:X-API-Key\", \"bearer\", \"query:api_key\"]")
        return ["header:X-API-Key"]
    for i, src in enumerate(sources):
        if not isinstance(src, str):
            v.error(["identity", "sources", i], f"expected a string, got {describe_value(src)}")
        else:
            v.attempt(["identity", "sources", i], parse_source, src)
    return sources


def _group_map(v: Validator, ident: Mapping[str, Any], section: str, groups: Groups) -> dict[str, str]:
    """One of ``keys``, ``hashed_keys``, ``patterns``: key -> the name of a declared group."""
    table = ident.get(section) or {}
    if not isinstance(table, Mapping):
        v.error(["identity", section], f"expected a table of key = \"group\", got {describe_value(table)}")
        table = {}
    clean: dict[str, str] = {}
    for k, g in table.items():
        if not isinstance(g, str):
            v.error(["identity", section, str(k)], f"expected a group name, got {describe_value(g)}")
        elif g not in groups.limits and g not in groups.declared:
            v.error(["identity", section, str(k)], f"unknown group {g!r}; defined groups: {', '.join(groups.declared) or 'none'}")
        else:
            clean[str(k)] = g
    if section == "hashed_keys":
        for k in clean:
            if not re.fullmatch(r"[0-9a-fA-F]{64}", k):
                v.error(["identity", section, k], "expected a SHA-256 hex digest (64 hex characters)")
    return clean


def spec_key(v: Validator, path: list[str | int], spec: str, identity: Identity | None, identity_failed: bool) -> KeyFunc | None:
    """The key function of ``key = "<spec>"``; ``None`` after a problem (or when it names an
    ``[identity]`` section that failed: that section's problems say why)."""
    try:
        kind, _ = parse_key_spec(spec)
    except ValueError as exc:
        v.error(path, str(exc))
        return None
    if kind == "identity" and identity is None and identity_failed:
        return None
    return v.attempt(path, lambda: key_function(spec, identity))  # type: ignore[no-any-return]


def bans_section(v: Validator, raw: Any, identity: Identity | None, identity_failed: bool) -> Bans | None:
    """The ``[bans]`` section, built when it has no problem."""
    b = v.table(raw, ["bans"], _BANS)
    kwargs: dict[str, Any] = {}
    for name in ("within", "duration", "max_duration", "cache_for"):
        if name in b:
            kwargs[name] = v.attempt(["bans", name], parse_duration, b[name])
    for name, kind in (("after", int), ("status", int), ("growth", (int, float))):
        if name in b:
            kwargs[name] = v.typed(b, name, ["bans"], kind)
    # Checked here, each at its own line, rather than by Bans() (which stops at the first).
    if kwargs.get("after") is not None and kwargs["after"] < 1:
        v.error(["bans", "after"], f"must be at least 1 rejection, got {kwargs['after']!r}")
        kwargs["after"] = None
    if kwargs.get("growth") is not None and kwargs["growth"] < 1:
        v.error(["bans", "growth"], f"must be 1 (constant) or more, got {kwargs['growth']!r}")
        kwargs["growth"] = None
    if kwargs.get("status") is not None and kwargs["status"] not in (403, 429):
        v.error(["bans", "status"], f"must be 403 or 429, got {kwargs['status']!r}")
        kwargs["status"] = None
    if "key" in b:
        key_spec = v.typed(b, "key", ["bans"], str)
        if key_spec is not None:
            kwargs["key"] = spec_key(v, ["bans", "key"], key_spec, identity, identity_failed)
    if any(value is None for value in kwargs.values()):
        return None
    return v.attempt(["bans"], lambda: Bans(**kwargs))  # type: ignore[no-any-return]
