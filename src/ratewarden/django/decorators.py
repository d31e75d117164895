"""``@limit``: a limit on one view, function-based or class-based (``method_decorator``), sync or
async, named after django-ratelimit's ``@ratelimit``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from ..algorithms import AlgorithmName
from ..enforcement.answers import HeaderOptions
from ..enforcement.outcome import ALLOW, ALLOWED
from ..errors import ConfigurationError
from ..headers import HeaderMode, HeaderStyle
from ..limiter import Limiter
from ..limits import DEFAULT_ALGORITHM
from ..rates import Rate, freeze_rates
from ..route_limits import Declared
from ..rules import CompiledRule, CostFunc, http_methods
from .config import DjangoConfig, current_config
from .guard import Answered, outcome_async, outcome_sync
from .keys import KeySpec, check_key_spec, django_key
from .responses import add_headers
from .scope import in_event_loop

__all__ = ["ALL", "UNSAFE", "limit"]

ALL = None
"""``method=ALL``: every method counts (the default)."""
UNSAFE = ("DELETE", "PATCH", "POST", "PUT")
"""``method=UNSAFE``: the methods that change something."""

View = Callable[..., Any]


class _Bound:
    """The decorator's limit (declared in the core, ``route_limits.Declared``), compiled on first use
    with the configuration of the settings (the ``ip`` key's trusted proxies, the limiter), and again
    when the settings change."""

    __slots__ = ("declared", "key", "label", "limiter", "lock", "state")

    def __init__(self, key: KeySpec, label: str, limiter: Limiter | None, declared: Declared) -> None:
        self.key = key
        self.label = label
        self.limiter = limiter
        self.declared = declared
        self.lock = threading.Lock()
        self.state: tuple[DjangoConfig, Limiter, tuple[CompiledRule, ...]] | None = None

    def get(self) -> tuple[DjangoConfig, Limiter, tuple[CompiledRule, ...]]:
        config = current_config()
        state = self.state
        if state is not None and state[0] is config:
            return state
        with self.lock:
            limiter = self.limiter or config.limiter
            key = django_key(self.key, config.client_ip, self.label)
            # Counted under the label, shown as the user named it: ``name``, else the rate as written.
            state = (config, limiter, (self.declared.compiled(self.label, limiter.prefix, key, label=""),))
            self.state = state
            return state


def limit(
    rate: str | Rate | Iterable[str | Rate],
    *,
    key: KeySpec = "ip",
    method: str | Iterable[str] | None = ALL,
    block: bool = True,
    name: str | None = None,
    algorithm: AlgorithmName = DEFAULT_ALGORITHM,
    cost: float | CostFunc = 1,
    limiter: Limiter | None = None,
    headers: HeaderMode | None = None,
    header_style: HeaderStyle | None = None,
) -> Callable[[View], View]:
    """Limit a view: ``@limit("10/m", key="user_or_ip")`` on a function, or
    ``@method_decorator(limit(...), name="dispatch")`` on a class-based view.

    Over the limit the view is not called and the answer is a 429 (problem+json, ``Retry-After``), or
    the response of the ``ON_LIMIT`` setting;
    with ``block=False`` the view is called with ``request.limited = True`` and decides itself.
    Allowed responses get the rate-limit headers. A store failure follows ``ON_ERROR``.

    Args:
        rate: One rate or several: ``"10/m"``, ``"100/min; 1000/day"``, a ``Rate``, or a list of them;
            every one must allow.
        key: Who is charged: ``"ip"`` (the default; ``TRUSTED_PROXIES`` honoured), ``"user"``,
            ``"user_or_ip"``, ``"header:<name>"``, ``"get:<name>"``, ``"post:<name>"``, ``"bearer"``, a
            dotted path or callable of the request (or of ``(group, request)``), or a ratewarden key
            function of the scope.
        method: Which methods count (others pass unchecked): one name, several (``UNSAFE``), or
            ``ALL`` (``None``, the default).
        block: Answer 429 over the limit (the default); ``False`` sets ``request.limited`` and calls
            the view.
        name: The limit's name (django-ratelimit's ``group``): views with one name share one count.
            The default counts each view on its own (under its module-qualified name, never sent to
            clients: headers and 429 bodies then name the rate as written, ``10/m``).
        algorithm: The algorithm's name (default ``"fixed_window"``).
        cost: What one request costs: a number, or a function of the scope.
        limiter: Checks the limit; the default is the one of ``settings.RATEWARDEN`` (its ``STORE``).
        headers: When to send rate-limit headers: ``"always"``, ``"on_limit"`` or ``"off"``; the
            default is the ``HEADERS`` setting.
        header_style: ``"ietf"``, ``"legacy"`` or ``"both"``; the default is the ``HEADER_STYLE`` setting.
    """
    # A bad rate, algorithm or cost fails here, not at the first request.
    declared = Declared(freeze_rates(rate, "limit() rate"), cost=cost, algorithm=algorithm, name=name)
    check_key_spec(key)
    methods = http_methods(method, "limit()")
    if headers is not None and headers not in ("always", "on_limit", "off"):
        raise ConfigurationError(f"limit() headers must be 'always', 'on_limit' or 'off', got {headers!r}")
    if header_style is not None and header_style not in ("ietf", "legacy", "both"):
        raise ConfigurationError(f"limit() header_style must be 'ietf', 'legacy' or 'both', got {header_style!r}")

    bounds: dict[str, _Bound] = {}

    def decorate(view: View) -> View:
        label = name or f"{view.__module__}.{view.__qualname__}"
        # method_decorator decorates the bound method on every request: one rule per label all the same.
        bound = bounds.get(label)
        if bound is None:
            bound = bounds.setdefault(label, _Bound(key, label, limiter, declared))
        view_is_async = iscoroutinefunction(view) or _async_class_view(view)
        if not view_is_async and callable(key) and iscoroutinefunction(key):
            raise ConfigurationError(f"limit() on {label}: an async key function needs an async view")
        guarded = _Guarded(view, bound, methods, block, headers, header_style)
        if view_is_async:

            @functools.wraps(view)
            async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
                return await guarded.call_async(request, args, kwargs)

            return markcoroutinefunction(async_wrapper)

        @functools.wraps(view)
        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            return guarded.call_sync(request, args, kwargs)

        return wrapper

    return decorate


@dataclass(slots=True, eq=False)
class _Guarded:
    """One view under ``@limit``: each request its method counts is checked against the bound rule,
    then answered (429, or the fail-closed 503) or passed to the view, whose allowed response gets
    the rate-limit headers."""

    view: View
    bound: _Bound
    methods: frozenset[str] | None
    block: bool
    headers: HeaderMode | None
    header_style: HeaderStyle | None
    _answers: tuple[DjangoConfig, HeaderOptions] | None = field(default=None, init=False)

    def applies(self, request: Any) -> bool:
        return self.methods is None or request.method in self.methods

    def answers(self, config: DjangoConfig) -> HeaderOptions:
        """The view's own header options over the settings' (built once per settings)."""
        if self.headers is None and self.header_style is None:
            return config.answers
        built = self._answers
        if built is None or built[0] is not config:
            options = HeaderOptions(self.headers or config.headers, self.header_style or config.header_style)
            built = self._answers = (config, options)
        return built[1]

    def finish(self, request: Any, outcome: Answered) -> Any:
        """The answer instead of the view's (None: call the view), ``request.limited`` set."""
        decision, answer, _ = outcome
        if decision is not None and not decision.allowed:
            request.limited = True
            if self.block:
                return answer
        elif answer is not None:  # the fail-closed 503
            return answer
        elif not getattr(request, "limited", False):
            request.limited = False
        return None

    @staticmethod
    def with_headers(response: Any, outcome: Answered) -> Any:
        """The view's response with an allowed ``Outcome``'s headers (a refusal's stay off it)."""
        if outcome[2].verdict == ALLOW:
            add_headers(response, outcome[2].headers)
        return response

    async def call_async(self, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.applies(request):
            result = self.view(request, *args, **kwargs)
            return await result if _awaitable(result) else result
        config, checker, rules = self.bound.get()
        outcome: Answered = (None, None, ALLOWED)
        if checker.enabled:
            answers = self.answers(config)
            on_limit = config.on_limit if self.block else None
            outcome = await outcome_async(checker, rules, request, answers, rules[0].policy, on_limit)
        answer = self.finish(request, outcome)
        if answer is not None:
            return answer
        result = self.view(request, *args, **kwargs)
        if _awaitable(result):
            result = await result
        return self.with_headers(result, outcome)

    def call_sync(self, request: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if in_event_loop():  # a sync dispatch() of an async class-based view: its handler's coroutine
            return self.call_async(request, args, kwargs)
        if not self.applies(request):
            return self.view(request, *args, **kwargs)
        config, checker, rules = self.bound.get()
        outcome: Answered = (None, None, ALLOWED)
        if checker.enabled:
            answers = self.answers(config)
            on_limit = config.on_limit if self.block else None
            outcome = outcome_sync(checker, rules, request, answers, rules[0].policy, on_limit)
        answer = self.finish(request, outcome)
        if answer is not None:
            return answer
        return self.with_headers(self.view(request, *args, **kwargs), outcome)


def _async_class_view(view: View) -> bool:
    """Whether ``view`` is a method of an async class-based view (``method_decorator`` on the sync
    ``dispatch`` of a view whose handlers are ``async def``: it returns their coroutine)."""
    owner = getattr(getattr(view, "func", view), "__self__", None)
    return bool(getattr(type(owner), "view_is_async", False))


def _awaitable(value: object) -> bool:
    return hasattr(value, "__await__")
