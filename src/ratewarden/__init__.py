"""ratewarden: fast, exact rate limiting for ASGI apps."""

from .asgi.middleware import RateLimitMiddleware
from .decision import Decision
from .limiter import Limiter
from .limits import Limit
from .rates import Rate, parse_rate, parse_rates
from .rules import Rule, RuleSet
from .stores.base import Store, StoreError
from .stores.memory import MemoryStore

__all__ = [
    "Decision",
    "Limit",
    "Limiter",
    "MemoryStore",
    "Rate",
    "RateLimitMiddleware",
    "Rule",
    "RuleSet",
    "Store",
    "StoreError",
    "parse_rate",
    "parse_rates",
]

__version__ = "0.1.0"
