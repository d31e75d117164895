"""What ``PolicyMiddleware``'s requests read, below the middleware: the policy in force
(``Runtime``) and what a matched rule tuple needs beyond a plain check (``Needs``).

Kept apart from ``asgi.py`` so that the per-request context and the admin operations can name
these types without importing the middleware.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..rules import CompiledRule, RuleSet
from .bans import Bans
from .schema import Policy
from .tiers import PolicyRule

__all__ = ["Needs", "Runtime"]


@dataclass(frozen=True)
class Runtime:
    """Everything a request reads from the current policy, swapped as one object."""

    rules: RuleSet
    shadow: bool
    bans: Bans | None
    show_group: bool
    policy: Policy | None


class Needs:
    """What a matched rule tuple needs beyond a plain check (computed once per tuple)."""

    __slots__ = ("charged", "delayed", "tiered")

    def __init__(self, matched: Sequence[CompiledRule]) -> None:
        self.tiered = any(isinstance(r.rule, PolicyRule) and r.rule.tiers is not None for r in matched)
        self.delayed = any(getattr(r.rule, "delay", None) is not None for r in matched)
        self.charged = any(getattr(r.rule, "charge", None) is not None for r in matched)
