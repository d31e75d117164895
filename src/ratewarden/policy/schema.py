"""The policy file's schema: validation of the parsed document into a ``Policy``, with every
problem reported as ``file:line: field: message``.

Document layout (TOML shown; YAML has the same structure)::

    version = 1
    [settings]   algorithm, shadow, show_group, headers, store, allow_empty
    [identity]   sources, unknown_group, anonymous_group, keys, hashed_keys, patterns
    [groups.<name>]  limits = ["10/s", "500/min"]  |  unlimited = true
    [[rules]]    path, name, methods, rate | tiered, key, algorithm, cost, bypass, shadow,
                 delay = {max_wait, burst, max_waiting}, charge = {statuses}
    [bans]       after, within, duration, growth, max_duration, status, key
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..algorithms import ALGORITHMS, unknown_algorithm
from ..rates import parse_rates
from ..rules import Rule
from ..stores.base import Store
from ..stores.memory import MemoryStore
from ..stores.urls import check_store_url, open_store
from .bans import Bans
from .problems import Locate, PolicyError, Problem, Validator, describe_value
from .rule_section import RuleDefaults, rules_section
from .sections import bans_section, groups_section, identity_section, parse_duration
from .tiers import PolicyRule, Tiers

__all__ = ["Locate", "Policy", "PolicyError", "Problem", "limits_nothing", "parse_duration", "require_limits", "validate"]

_TOP = ("version", "settings", "identity", "groups", "rules", "bans")
_SETTINGS = ("algorithm", "shadow", "show_group", "store", "allow_empty")


@dataclass
class Policy:
    """A validated policy, ready to build rules from.

    Args:
        rules: The rules to enforce.
        tiers: The ``[identity]``/``[groups]`` tiers, if any.
        bans: The ``[bans]`` settings, if any.
        shadow: ``settings.shadow``: count and log, never block.
        show_group: ``settings.show_group``: 429 bodies name the caller's group.
        algorithm: ``settings.algorithm``: the default algorithm of the rules.
        source: Where it was read from, for messages.
        data: The parsed file, as read.
        store: ``settings.store``: a store URL (``shm://api``, ``redis://...``); ``None`` means a
            ``MemoryStore``.
        allow_empty: ``settings.allow_empty``: a policy that limits nothing is intended (else
            ``load_policy`` refuses it).
    """

    rules: list[Rule]
    tiers: Tiers | None = None
    bans: Bans | None = None
    shadow: bool = False
    show_group: bool = True
    algorithm: str = "fixed_window"
    source: str = "<policy>"
    data: dict[str, Any] = field(default_factory=dict)
    store: str | None = None  # settings.store: a store URL (shm://api, redis://..), None = MemoryStore
    allow_empty: bool = False

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


def limits_nothing(policy: Policy) -> bool:
    """Whether ``policy`` has no rule that limits anything (no rules, or only ``bypass`` ones).

    Args:
        policy: The policy.
    """
    return all(rule.bypass for rule in policy.rules)


def require_limits(policy: Policy) -> None:
    """Refuse a policy that limits nothing unless it says ``allow_empty = true``: an empty or
    cut-short file read while it was being written must not switch every limit off.

    Args:
        policy: The policy, validated.
    """
    if policy.allow_empty or not limits_nothing(policy):
        return
    what = "has only bypass rules" if policy.rules else "has no rules"
    raise PolicyError([Problem(
        "", f"the policy {what}, so it limits nothing (an empty or half-written file?); "
        "set allow_empty = true under [settings] if that is intended", None, policy.source,
    )])


def describe_rule(rule: Rule) -> str:
    methods = ",".join(sorted(rule.methods)) if rule.methods else "*"
    if rule.bypass:
        what = "bypass (no limits)"
    elif isinstance(rule, PolicyRule) and rule.tiers is not None:
        what = "limits of the caller's group"
    else:
        what = "; ".join(str(limit.rate) for limit in rule.limits)
    extras: list[str] = [rule.algorithm] if not rule.bypass else []
    if rule.shadow:
        extras.append("shadow")
    if isinstance(rule, PolicyRule):
        if rule.delay is not None:
            extras.append(f"delay up to {rule.delay.max_wait:g}s (burst {rule.delay.burst})")
        if rule.charge is not None:
            extras.append(f"counts only statuses {', '.join(str(s) for s in rule.charge.spec)}")
    suffix = f" [{', '.join(extras)}]" if extras else ""
    return f"{rule.name}: {methods} {rule.path}: {what}{suffix}"


def _store_url(url: str) -> str:
    check_store_url(url)
    return url


def validate(data: Any, locate: Locate = lambda path: None, source: str = "<policy>") -> Policy:
    """Check a parsed policy document and build the ``Policy``; raises ``PolicyError`` listing
    every problem (with line numbers when ``locate`` can find them)."""
    v = Validator(locate, source)
    if not isinstance(data, Mapping):
        raise PolicyError([Problem("", f"the policy must be a table/mapping at the top level, got {describe_value(data)}", None, source)])
    top = v.table(data, [], _TOP)
    version = top.get("version", 1)
    if version != 1:
        v.error(["version"], f"unsupported version {version!r}; this ratewarden reads version 1")

    settings = v.table(top.get("settings"), ["settings"], _SETTINGS)
    algorithm = v.typed(settings, "algorithm", ["settings"], str, "fixed_window")
    if algorithm not in ALGORITHMS:
        v.error(["settings", "algorithm"], unknown_algorithm(algorithm))
        algorithm = "fixed_window"
    shadow = v.typed(settings, "shadow", ["settings"], bool, False)
    show_group = v.typed(settings, "show_group", ["settings"], bool, True)
    store = v.typed(settings, "store", ["settings"], str)
    allow_empty = v.typed(settings, "allow_empty", ["settings"], bool, False)
    if store is not None:
        store = v.attempt(["settings", "store"], _store_url, store)

    groups = groups_section(v, top.get("groups"))
    identity = identity_section(v, top["identity"], groups) if "identity" in top else None
    tiers: Tiers | None = None
    if identity is not None and groups.limits and groups.valid:
        tiers = v.attempt(["groups"], lambda: Tiers(groups.limits, identity))
    identity_failed = "identity" in top and identity is None
    tiers_failed = tiers is None and "identity" in top and bool(groups.declared)
    defaults = RuleDefaults(algorithm, identity, tiers, identity_failed, tiers_failed)
    rules = rules_section(v, top.get("rules", []), defaults)
    bans = bans_section(v, top["bans"], identity, identity_failed) if "bans" in top else None
    if v.problems:
        raise PolicyError(v.sorted_problems())
    return Policy(rules, tiers, bans, shadow, show_group, algorithm, source, dict(data), store, allow_empty)
