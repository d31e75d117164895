"""Declarative, reloadable policies: tiers of API keys, per-path rules, bans, delays, shadow mode.

``load_policy(path)`` reads a TOML or YAML file into a validated ``Policy``;
``PolicyMiddleware`` (ASGI) and ``WSGIPolicyMiddleware`` (WSGI) enforce it and reload it when the
file changes.
"""

from .asgi import PolicyMiddleware
from .bans import Bans, BanStatus
from .delay import Delay
from .loader import load_policy, parse_policy
from .reload import PolicyReloader
from .schema import Policy, PolicyError, Problem
from .stats import rule_stats
from .tiers import Identity, PolicyRule, Tiers
from .wsgi import WSGIPolicyMiddleware

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
    "WSGIPolicyMiddleware",
    "load_policy",
    "parse_policy",
    "rule_stats",
]
