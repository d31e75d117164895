"""``PolicyMiddleware``'s per-request context: the public ``RequestContext`` (``ratewarden.context``)
plus the working state its stages fill in (ban check, group choice, limit check, delay, refusal or
serving). Those extra attributes are the middleware's, not an API. Each request through the
middleware gets a new one, replacing what an outer middleware left.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..rules import CompiledRule
from .runtime import Needs, Runtime
from .tiers import IdentityContext

__all__ = ["PolicyContext"]


class PolicyContext(IdentityContext):
    """A ``RequestContext`` with what ``PolicyMiddleware`` needs while it handles the request.

    Args:
        runtime: The policy in force for this request.
        rules: The rules it matched.
        needs: What those rules need beyond a plain check.
    """

    def __init__(self, runtime: Runtime, rules: Sequence[CompiledRule], needs: Needs) -> None:
        super().__init__()
        self.runtime = runtime
        self.rules = rules  # the matched rules; a tiered rule replaced by its group's rule
        self.needs = needs
        self.ban_key: str | None = None
        self.identity = None  # resolved once per request (IdentityContext)
