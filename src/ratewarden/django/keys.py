"""Who a request is charged to, spelled as in django-ratelimit: ``ip``, ``user``, ``user_or_ip``,
``header:<name>``, ``get:<name>``, ``post:<name>``, a dotted path or a callable of the request;
ratewarden's own key functions (``ratewarden.keys``) work as they are.

A key without a value (an anonymous user for ``user``, a missing header or parameter) charges the
client IP instead, as everywhere in ratewarden: requests without the value never share one
bucket. Header, query and form values are stored hashed (they are often secrets).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.utils.functional import LazyObject, empty  # type: ignore[import-untyped]
from django.utils.module_loading import import_string  # type: ignore[import-untyped]

from ..callables import require_arguments
from ..credentials import digest
from ..errors import ConfigurationError
from ..keys import ClientIP, KeyFunc, bearer_token, header, query_param
from ..types import Scope
from .scope import in_event_loop, request_of, request_scope

__all__ = ["KeySpec", "RequestKey", "UserKey", "check_key_spec", "django_key", "user_key_text"]

KeySpec = str | Callable[..., Any]
"""A key as the decorator and the ``RULES`` setting take it: a name (``"user_or_ip"``,
``"header:X-API-Key"``...), a dotted path to a callable, a callable of the request (or of
``(group, request)``, django-ratelimit's signature), or a ratewarden key function of the scope."""

_NAMED = ("ip", "user", "user_or_ip", "bearer")
_WITH_ARGUMENT = ("header", "get", "query", "post")
_FORMS = "'ip', 'user', 'user_or_ip', 'bearer', 'header:<name>', 'get:<name>', 'post:<name>', a dotted path or a callable"


def user_key_text(user: Any) -> str | None:
    """``user:<pk>`` for an authenticated user; ``None`` (no value) for an anonymous one.

    Args:
        user: ``request.user``.
    """
    if user is not None and getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    return None


def _user(request: Any) -> Any:
    try:
        return request.user
    except AttributeError:
        raise ConfigurationError(
            "key 'user' needs request.user: put ratewarden.django.RateLimitMiddleware after "
            "django.contrib.auth.middleware.AuthenticationMiddleware"
        ) from None


def _loaded(request: Any) -> bool:
    """Whether ``request.user`` is there without a database query (not a lazy object yet to load)."""
    user = request.__dict__.get("user")
    return not (isinstance(user, LazyObject) and user._wrapped is empty)


class UserKey:
    """``user`` and ``user_or_ip``: the authenticated user's primary key, else the client IP.

    In async code the user is loaded with ``request.auser()`` (Django 5+) or in a thread, never
    with a database query on the event loop.

    Args:
        client_ip: Who an anonymous request is charged to.
    """

    __slots__ = ("client_ip",)

    def __init__(self, client_ip: ClientIP) -> None:
        self.client_ip = client_ip

    def __call__(self, scope: Scope) -> str | Awaitable[str]:
        request = request_of(scope)
        if in_event_loop() and not _loaded(request):
            return self._loaded_later(request, scope)
        return user_key_text(_user(request)) or self.client_ip(scope)

    async def _loaded_later(self, request: Any, scope: Scope) -> str:
        auser = getattr(request, "auser", None)
        if auser is not None:
            text = user_key_text(await auser())
        else:
            text = await sync_to_async(lambda: user_key_text(_user(request)))()
        return text or self.client_ip(scope)


class RequestKey:
    """A key function of the Django request (``func(request)``, or ``func(group, request)`` as
    django-ratelimit calls it) as a key function of the scope.

    Args:
        func: The callable; it returns the key (``None`` or ``""``: no value, the client IP).
        group: What a two-argument ``func`` receives first (the limit's name).
        client_ip: Who a request without a value is charged to.
    """

    __slots__ = ("client_ip", "func", "group", "with_group")

    def __init__(self, func: Callable[..., Any], group: str, client_ip: ClientIP) -> None:
        self.func = func
        self.group = group
        self.client_ip = client_ip
        self.with_group = _positional_count(func) >= 2

    def __call__(self, scope: Scope) -> str | Awaitable[str]:
        request = request_of(scope)
        value = self.func(self.group, request) if self.with_group else self.func(request)
        if isinstance(value, Awaitable):
            return self._awaited(value, scope)
        return self._text(value, scope)

    async def _awaited(self, value: Awaitable[Any], scope: Scope) -> str:
        return self._text(await value, scope)

    def _text(self, value: object, scope: Scope) -> str:
        if value is None or value == "":
            return self.client_ip(scope)
        return value if type(value) is str else str(value)


def _positional_count(func: Callable[..., Any]) -> int:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in parameters if p.kind in kinds and p.default is inspect.Parameter.empty)


def _post_key(name: str, client_ip: ClientIP) -> Callable[[Any], str]:
    prefix = f"post.{name}:"

    def key(request: Any) -> str:
        value = request.POST.get(name)
        return prefix + digest(value) if value else client_ip(request_scope(request))

    return key


def _is_scope_key(func: Callable[..., Any]) -> bool:
    """A ratewarden key function of the scope (``ratewarden.keys``, a policy's identity...)."""
    module = getattr(func, "__module__", None) or type(func).__module__
    return module.startswith("ratewarden.") and not module.startswith("ratewarden.django")


def check_key_spec(spec: KeySpec, what: str = "key") -> None:
    """Refuse a key that cannot be used (at start-up, before any request): an unknown name, a
    missing argument, a dotted path that does not import, a callable that cannot take the request.

    Args:
        spec: The key.
        what: Names it in the error message.
    """
    if callable(spec):
        _check_request_key(spec, what)
        return
    if not isinstance(spec, str):
        raise ConfigurationError(f"{what} must be {_FORMS}; got {spec!r}")
    kind, sep, arg = spec.partition(":")
    kind = kind.strip().lower()
    if not sep and kind in _NAMED:
        return
    if sep and kind in _WITH_ARGUMENT and arg.strip():
        return
    if not sep and "." in spec:
        try:
            found = import_string(spec)
        except ImportError as exc:
            raise ConfigurationError(f"{what} {spec!r}: cannot import it ({exc})") from None
        if not callable(found):
            raise ConfigurationError(f"{what} {spec!r} is not callable")
        _check_request_key(found, f"{what} {spec!r}")
        return
    raise ConfigurationError(f"invalid {what} {spec!r}: use {_FORMS}")


def _check_request_key(func: Callable[..., Any], what: str) -> None:
    """A callable of the request is called as ``func(request)``, or ``func(group, request)`` when it
    has two required positional parameters; a ratewarden key function takes the scope."""
    if isinstance(func, ClientIP) or _is_scope_key(func):
        return
    count = 2 if _positional_count(func) >= 2 else 1
    expected = "two arguments, (group, request)" if count == 2 else "one argument, the request: def key(request): ..."
    require_arguments(func, count, what, expected)


def django_key(spec: KeySpec, client_ip: ClientIP, group: str = "") -> KeyFunc:
    """The key function of the scope that ``spec`` stands for.

    Args:
        spec: The key (see ``KeySpec``).
        client_ip: The client address with the trusted proxies of the settings: the ``ip`` key, and
            who a request without a value is charged to.
        group: The limit's name, given to a callable of ``(group, request)``.
    """
    check_key_spec(spec)
    if callable(spec):
        if isinstance(spec, ClientIP) or _is_scope_key(spec):
            return spec
        return _async_request_key(spec, group, client_ip) if _is_async(spec) else RequestKey(spec, group, client_ip)
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    arg = arg.strip()
    if kind == "ip":
        return client_ip
    if kind in ("user", "user_or_ip"):
        return UserKey(client_ip)
    if kind == "bearer":
        return bearer_token(fallback=client_ip)
    if kind == "header":
        return header(arg, fallback=client_ip)
    if kind in ("get", "query"):
        return query_param(arg, fallback=client_ip)
    if kind == "post":
        return RequestKey(_post_key(arg, client_ip), group, client_ip)
    return django_key(import_string(spec), client_ip, group)


def _is_async(func: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004


def _async_request_key(func: Callable[..., Any], group: str, client_ip: ClientIP) -> KeyFunc:
    """An ``async def`` callable of the request: a coroutine key function (async views only)."""
    inner = RequestKey(func, group, client_ip)

    async def key(scope: Scope) -> str:
        value = inner(scope)
        return await value if isinstance(value, Awaitable) else value

    return key
