"""``@limit``: rate-limit a plain Starlette endpoint (sync or async) without middleware.

Its 429, 503 and 400 are ``ratewarden.enforcement.answers``' (``rejection``, ``unavailable_answer``), sent
as they are (``answer_response``): byte for byte what the middleware and the FastAPI edge send.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from .algorithms import AlgorithmName
from .enforcement.answers import HeaderOptions
from .enforcement.check import LimitUnavailable, check_rules
from .enforcement.outcome import ALLOWED, REFUSE, failed, outcome_of
from .headers import HeaderMode, HeaderStyle
from .keys import KeyFunc, client_ip
from .limiter import Limiter
from .limits import DEFAULT_ALGORITHM
from .rates import Rate
from .route_limits import Declared
from .rules import CostFunc

__all__ = ["answer_response", "limit"]

Endpoint = Callable[[Request], "Response | Awaitable[Response]"]


def answer_response(status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
    """One of the limiter's own answers (``ratewarden.enforcement.answers``) as a Starlette
    ``Response``: the body and the complete header list (content type and length included) exactly
    as given, nothing added or reordered.

    Args:
        status: The HTTP status.
        body: The body.
        headers: The complete header list.
    """
    response = Response(body, status)
    response.raw_headers = headers
    return response


def limit(
    rate: str | Rate | Iterable[str | Rate],
    *,
    limiter: Limiter,
    key: KeyFunc = client_ip,
    algorithm: AlgorithmName = DEFAULT_ALGORITHM,
    cost: float | CostFunc = 1,
    name: str | None = None,
    headers: HeaderMode = "always",
    header_style: HeaderStyle = "both",
) -> Callable[[Endpoint], Callable[[Request], Awaitable[Response]]]:
    """Decorate ``async def endpoint(request)`` (or a sync one, run in the thread pool).

    Args:
        rate: One rate or several: ``"100/min"``, ``"10/s; 1000/day"``, a ``Rate``, or a list of them;
            every one must allow.
        limiter: Checks the limit on its store.
        key: Who is charged: a key function of the scope (default: the client IP).
        algorithm: The algorithm's name (default ``"fixed_window"``).
        cost: What one request costs: a number, or a function of the scope.
        name: The limit's name; the default ``None`` counts each endpoint on its own (under its
            module-qualified name, never sent to clients: headers and 429 bodies then name the rate
            as written, ``10/m``), so two endpoints never share a limit by accident.
        headers: When to send the rate-limit headers: ``"always"``, ``"on_limit"`` (429 answers only) or
            ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` (draft-10
            ``RateLimit``/``RateLimit-Policy``) or ``"legacy"`` (``X-RateLimit-*``).
    """

    answers = HeaderOptions(headers, header_style)

    def decorate(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        label = name or f"{endpoint.__module__}.{endpoint.__qualname__}"
        # Counted under the module-qualified name, shown as the user named it: ``name``, else the rate.
        declared = Declared(rate, key=key, cost=cost, algorithm=algorithm, name=name)
        rules = (declared.compiled(label, limiter.prefix, label=""),)
        is_async = inspect.iscoroutinefunction(endpoint)

        @functools.wraps(endpoint)
        async def wrapper(request: Request) -> Response:
            outcome = ALLOWED
            if limiter.enabled:
                try:
                    outcome = outcome_of(await check_rules(limiter, rules, request.scope), answers)
                except LimitUnavailable as exc:
                    outcome = failed(exc)
            if outcome.verdict == REFUSE:
                return answer_response(outcome.status, outcome.body, outcome.headers)
            result: Any = await endpoint(request) if is_async else await run_in_threadpool(endpoint, request)  # type: ignore[misc]
            if outcome.headers and isinstance(result, Response):
                result.headers.raw.extend(outcome.headers)
            return result  # type: ignore[no-any-return]

        return wrapper

    return decorate
