"""What the two policy middlewares share, whatever the server interface: the policy in force and
its reloads, the admin operations, and (``decider.Decider``) the decision of a
request, which do no I/O.

``PolicyCore`` is a mixin: ``PolicyMiddleware`` (ASGI, ``asgi.py``) and ``WSGIPolicyMiddleware``
(``wsgi.py``) each set ``limiter`` and ``rules`` and then call ``_start_policy``; each runs the same
step machines (``decide_steps``, ``strike_steps``, ``settle_steps``) with its driver, one awaiting
(``steps.drive``) and one blocking (``drive_blocking``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..enforcement.core import finish_key, key_of, rule_costs
from ..errors import ConfigurationError, UsageError
from ..headers import HeaderMode, HeaderStyle
from ..limiter import Limiter
from ..metrics import Metrics
from ..rules import CompiledRule, Rule, RuleSet
from ..steps import Adjust, Machine
from ..types import Scope
from .admin import Operations
from .bans import Bans
from .decider import REFUSE, Decider
from .reload import PolicyReloader
from .runtime import Needs, Runtime
from .schema import Policy

__all__ = ["PolicyCore", "policy_in_rules", "refund_amounts", "refunded", "settle_steps"]

log = logging.getLogger("ratewarden")
_refund_warned: set[str] = set()
_NO_BODY = (b"content-length", b"0")


def policy_in_rules(
    rules: Sequence[Rule] | RuleSet | str | Path | Policy, policy: str | Path | Policy | None,
) -> tuple[Sequence[Rule] | RuleSet, str | Path | Policy | None]:
    """The rules and the policy of ``PolicyMiddleware(app, limiter, rules, policy=...)``: a policy (a
    file's path or a ``Policy``) given where the rules go, ``PolicyMiddleware(app, limiter, policy)``,
    is taken as ``policy=``.

    Args:
        rules: The third argument.
        policy: The ``policy=`` argument.
    """
    if not isinstance(rules, (Policy, str, Path)):
        return rules, policy
    if policy is not None:
        raise ConfigurationError(
            f"a policy was given twice, as the rules argument ({rules!r:.60}) and as policy=; give it once, as policy="
        )
    return (), rules


def refunded(rules: Sequence[CompiledRule], status: int) -> Iterator[CompiledRule]:
    """The rules whose ``charge`` says a response of ``status`` does not count (to refund).

    Args:
        rules: The rules the request was charged to.
        status: The response's status.
    """
    for rule in rules:
        charge = getattr(rule.rule, "charge", None)
        if charge is not None and not charge.counts(status):
            yield rule


def refund_amounts(rule: CompiledRule, scope: Scope) -> list[float]:
    """What refunding ``rule``'s charge of this request adjusts each of its limits by.

    Args:
        rule: A rule the request was charged to.
        scope: The request's scope, for a cost function.
    """
    return [-c for c in rule_costs(rule, scope)]


def settle_steps(limiter: Limiter, scope: Scope, rules: Sequence[CompiledRule], status: int) -> Machine[None]:
    """Refund the charge of the rules whose ``charge`` says a response of ``status`` does not count
    (``Outcome.settle``), as a step machine; a failure is logged, never the request's.

    Args:
        limiter: Whose store was charged.
        scope: The request's scope (its keys, a cost function's input).
        rules: The rules the request was charged to.
        status: The response's status.
    """
    for rule in refunded(rules, status):
        try:
            found = key_of(limiter, rule, scope)
            key = found if isinstance(found, str) else (yield from finish_key(limiter, rule, scope, found))
            yield Adjust(limiter.store, rule.storage_keys(key), rule.limits, refund_amounts(rule, scope))
        except NotImplementedError as exc:
            name = type(limiter.store).__name__
            if name not in _refund_warned:
                _refund_warned.add(name)
                log.warning("after-response charging unavailable: %s", exc)
        except Exception as exc:
            log.warning("refund failed rule=%s: %s: %s", rule.rule.name, type(exc).__name__, exc)


class PolicyCore(Decider, Operations):
    """The policy state and the interface-neutral steps of a policy middleware (a mixin: the
    middleware sets ``limiter`` and ``rules``, then calls ``_start_policy``)."""

    limiter: Limiter
    rules: RuleSet
    headers: HeaderMode
    header_style: HeaderStyle
    metrics: Metrics | None
    shadow_header: bool
    reloader: PolicyReloader | None
    _defaults: tuple[bool, Bans | None, bool]
    _needs: dict[tuple[CompiledRule, ...], Needs]

    def _start_policy(
        self,
        policy: str | Path | Policy | None,
        watch: float | None,
        sighup: bool,
        shadow: bool,
        bans: Bans | None,
        metrics: Metrics | None,
        shadow_header: bool,
        show_group: bool,
    ) -> None:
        """Set up the policy state (the middleware's arguments of the same names) and load the file."""
        self._check_store(self.rules.rules, bans)
        self.metrics = metrics
        if metrics is not None:
            metrics.watch(self.limiter.store)
        self.shadow_header = shadow_header
        self._defaults = (shadow, bans, show_group)
        self._needs = {}
        self._runtime = Runtime(self.rules, shadow, bans, show_group, None)
        self.reloader = None
        if isinstance(policy, Policy):
            self.apply(policy)
        elif policy is not None:
            self.reloader = PolicyReloader(policy, self.apply, interval=watch or 1.0)
            self.reloader.load()
            if watch is not None:
                self.reloader.start()
            if sighup:
                self.reloader.install_sighup()

    def answer_steps(self, scope: Scope) -> Machine[tuple[int, list[tuple[bytes, bytes]], bytes]]:
        """The answer to an HTTP request when the app behind the policy answers ``200`` with an empty
        body, as a step machine: ``(status, complete header list, body)``, with the refusal's ban
        strike or the after-response refund done. A door with no app to run (``ratewarden serve``'s
        checks, ``PolicyMiddleware.answer``) runs it with its driver and sends what it returns.

        Args:
            scope: An HTTP scope; its ``state`` receives the request's context.
        """
        ctx = self._plan_request(scope)
        if ctx is None:
            return 200, [_NO_BODY], b""
        outcome = yield from self.decide_steps(ctx, scope)
        if outcome.verdict is REFUSE:
            if outcome.strike:
                yield from self.strike_steps(ctx)
            return outcome.status, outcome.headers, outcome.body
        if outcome.settle:
            yield from settle_steps(self.limiter, scope, ctx.rules, 200)
        return 200, [*outcome.headers, _NO_BODY], b""

    # -- policy --------------------------------------------------------------------------------

    @property
    def policy(self) -> Policy | None:
        """The policy in force (``None`` when the middleware was given rules, not a policy)."""
        return self._runtime.policy

    @property
    def shadow(self) -> bool:
        """Global shadow mode: count and log, never block."""
        return self._runtime.shadow

    @property
    def bans(self) -> Bans | None:
        """The bans in force, if any."""
        return self._runtime.bans

    def apply(self, policy: Policy) -> None:
        """Swap in ``policy`` atomically (one assignment); ban lists carry over.

        Args:
            policy: The new policy, already validated.
        """
        shadow, bans, show_group = self._defaults
        old = self._runtime.bans
        new_bans = policy.bans if policy.bans is not None else bans
        if old is not None and new_bans is not None and new_bans is not old:
            new_bans = old.configure_from(new_bans)
        self._check_store(policy.rules, new_bans)
        ruleset = RuleSet(policy.rules, self.limiter.prefix)
        self._runtime = Runtime(ruleset, policy.shadow or shadow, new_bans, policy.show_group and show_group, policy)
        self.rules = ruleset
        self._needs = {}

    def _check_store(self, rules: Sequence[Rule], bans: Bans | None) -> None:
        """At start-up (and before a reload takes effect): after-response charging refunds, so the
        store must be able to adjust; not at the first refund."""
        for rule in rules:
            if getattr(rule, "charge", None) is not None:
                self.limiter.store.require("adjust", f"rule {rule.name!r} (charge: counting only some statuses)")

    def reload(self) -> bool:
        """Reload the policy file (an admin call) once it has stopped changing: this blocks for the
        reloader's ``settle`` time at least (0.5 s), so call it in a thread from async code.
        ``False`` if the file was invalid or still changing (the old policy is kept)."""
        if self.reloader is None:
            raise UsageError("this middleware was not given a policy file to reload")
        return self.reloader.reload()

    def close(self) -> None:
        """Stop watching the policy file."""
        if self.reloader is not None:
            self.reloader.stop()
        if self.metrics is not None:
            self.metrics.close()
