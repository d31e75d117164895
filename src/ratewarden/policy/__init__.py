"""Declarative, reloadable policies: tiers of API keys, per-path rules, bans, delays, shadow mode.

``load_policy(path)`` reads a TOML or YAML file into a validated ``Policy``;
``PolicyMiddleware`` enforces it and reloads it when the file changes.
"""

from .asgi import PolicyMiddleware
from .bans import Bans, BanStatus
from .delay import Delay
from .loader import load_policy, parse_policy
from .reload import PolicyReloader
from .schema import Policy, PolicyError, Problem
from .stats import rule_stats
from .tiers import Identity, PolicyRule, Tiers

__all__ = [
    "BanStatus",
    "Bans",
    "Delay",
    "Identity",
    "Policy",
    "PolicyError",
    "PolicyMiddleware",
    "PolicyReloader",
    "PolicyRule",
    "Problem",
    "Tiers",
    "load_policy",
    "parse_policy",
    "rule_stats",
]
