"""ratewarden: fast, exact rate limiting for ASGI apps."""

from typing import TYPE_CHECKING

from . import _mypyc
from .asgi.middleware import RateLimitMiddleware
from .context import RequestContext, context_of
from .decision import Decision
from .errors import ConfigurationError, LimitUnavailable, RatewardenError, StoreError
from .limiter import Limiter
from .limits import Limit
from .rates import Rate, parse_rate, parse_rates
from .rules import Rule, RuleSet
from .stores import memory as _memory
from .stores.base import Store
from .stores.memory import MemoryStore

if TYPE_CHECKING:
    from .policy.asgi import PolicyMiddleware

__all__ = [
    "COMPILED",
    "ConfigurationError",
    "Decision",
    "Limit",
    "LimitUnavailable",
    "Limiter",
    "MemoryStore",
    "PolicyMiddleware",
    "Rate",
    "RateLimitMiddleware",
    "RatewardenError",
    "RequestContext",
    "Rule",
    "RuleSet",
    "Store",
    "StoreError",
    "build_description",
    "context_of",
    "parse_rate",
    "parse_rates",
]

__version__ = "0.1.0"

COMPILED: bool = _mypyc.is_compiled(_memory)
"""True when the hot path (algorithms, stores, rules, middleware...) runs as mypyc-compiled
extension modules (a wheel built with mypyc); False for the pure-Python package
(``RATEWARDEN_PURE_PYTHON=1`` at install time, an editable install, or no compiler)."""
if COMPILED:
    _mypyc.repair_compiled_abcs()


def build_description() -> str:
    """``"mypyc-compiled"`` or ``"pure Python"`` (shown by ``ratewarden --version`` and bench reports)."""
    return "mypyc-compiled" if COMPILED else "pure Python"


def __getattr__(name: str) -> object:
    # Lazy, so ``import ratewarden`` does not load the policy package (and its parsers).
    if name == "PolicyMiddleware":
        from .policy.asgi import PolicyMiddleware

        return PolicyMiddleware
    raise AttributeError(f"module 'ratewarden' has no attribute {name!r}")
