"""``RateLimitMiddleware``: the rules of ``settings.RATEWARDEN["RULES"]`` (and ``"POLICY"``) on
every request, sync under WSGI and async under ASGI (Django picks the mode it runs in).

Add ``"ratewarden.django.RateLimitMiddleware"`` to ``MIDDLEWARE``, after
``AuthenticationMiddleware`` when a rule's key is ``user`` or ``user_or_ip``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from ..rules import policy_of
from .config import SETTING, SettingsError, current_config
from .guard import outcome_async, outcome_sync
from .responses import add_headers

__all__ = ["RateLimitMiddleware"]


class RateLimitMiddleware:
    """Django middleware enforcing ``settings.RATEWARDEN``'s rules: a 429 (problem+json, with
    ``Retry-After``) over a limit, rate-limit headers on allowed responses, a 503 when the store
    fails under ``ON_ERROR = "closed"``. Rules match ``request.path_info``, the path Django routes.

    Args:
        get_response: The next middleware or the view (Django passes it).
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        config = current_config()
        if config.rules is None:
            raise SettingsError(
                f"{SETTING}: ratewarden.django.RateLimitMiddleware is in MIDDLEWARE but neither RULES nor POLICY "
                "gives it a rule (for per-view limits alone, use @limit and remove the middleware)"
            )
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self.is_async:
            return self._acall(request)
        config = current_config()
        rules = config.rules.match(request.method, request.path_info) if config.rules is not None else ()
        if not rules or not config.limiter.enabled:
            return self.get_response(request)
        policy = policy_of(rules)
        _, answer, outcome = outcome_sync(config.limiter, rules, request, config.answers, policy, config.on_limit)
        if answer is not None:
            return answer
        response = self.get_response(request)
        add_headers(response, outcome.headers)
        return response

    async def _acall(self, request: Any) -> Any:
        config = current_config()
        rules = config.rules.match(request.method, request.path_info) if config.rules is not None else ()
        if not rules or not config.limiter.enabled:
            return await self.get_response(request)
        policy = policy_of(rules)
        _, answer, outcome = await outcome_async(
            config.limiter, rules, request, config.answers, policy, config.on_limit
        )
        if answer is not None:
            return answer
        response = await self.get_response(request)
        add_headers(response, outcome.headers)
        return response
