"""The per-request context of ``PolicyMiddleware``: one object that its stages fill in (ban check,
group choice, limit check, delay, refusal or serving) and that the application reads afterwards.

It is the only thing the middleware puts in ``scope["state"]``, under ``"ratewarden"``
(``request.state.ratewarden`` in Starlette and FastAPI). Public attributes:

* ``decision``: the enforced limits' ``Decision`` (``None`` when no limit applied or the check
  could not be made under the fail-open policy);
* ``group``: the caller's group when a tiered rule applied, else ``""``;
* ``would_deny``: in global shadow mode, the decision that would have refused the request;
* ``shadow``: the decisions of per-rule shadow limits (``Rule(..., shadow=True)``).

The other attributes are the middleware's working state, not an API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..decision import Decision
from ..rules import CompiledRule
from ..types import Scope

if TYPE_CHECKING:
    from .middleware import Plan, Runtime
    from .tiers import Identity

__all__ = ["STATE_KEY", "RequestContext", "context_of"]

STATE_KEY = "ratewarden"


class RequestContext:
    """What ``PolicyMiddleware`` knows and decided about one request.

    Args:
        runtime: The policy in force for this request.
        rules: The rules it matched.
        plan: What those rules need beyond a plain check.
    """

    __slots__ = ("ban_key", "decision", "group", "identity", "plan", "rules", "runtime", "shadow", "would_deny")

    def __init__(self, runtime: Runtime, rules: Sequence[CompiledRule], plan: Plan) -> None:
        self.decision: Decision | None = None
        self.group = ""
        self.would_deny: Decision | None = None
        self.shadow: list[Decision] = []
        self.runtime = runtime
        self.rules = rules  # the matched rules; a tiered rule replaced by its group's rule
        self.plan = plan
        self.ban_key: str | None = None
        # (the Identity that resolved it, (group, storage key)): resolved once per request
        self.identity: tuple[Identity, tuple[str, str]] | None = None

    def __repr__(self) -> str:
        return f"RequestContext(decision={self.decision!r}, group={self.group!r}, would_deny={self.would_deny!r}, shadow={self.shadow!r})"


def context_of(scope: Scope) -> RequestContext | None:
    """The context ``PolicyMiddleware`` attached to this request, if any.

    Args:
        scope: The ASGI connection scope.
    """
    state = scope.get("state")
    if state:
        found = state.get(STATE_KEY)
        if type(found) is RequestContext:
            return found
    return None
