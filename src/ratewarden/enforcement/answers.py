"""The limiter's own answers, framework-neutral: the 429 and 503 as RFC 9457
``application/problem+json`` bodies with their complete header lists, and the rate-limit headers
every door writes (``limited_headers``, ``HeaderOptions.allowed_headers``; as text for a gateway's
protocol: ``text_headers``).

Every integration sends these bytes as they are (``ratewarden.asgi.responses`` over ASGI), so a
rejection reads the same whichever layer wrote it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..caches import remember
from ..decision import Decision
from ..errors import AmbiguousRequest
from ..headers import HeaderMode, HeaderStyle, policy_value, rate_limit_headers, retry_after_header
from ..limits import Limit
from .options import check_header_options

__all__ = [
    "UNAVAILABLE_BODY",
    "UNAVAILABLE_HEADERS",
    "HeaderOptions",
    "limited_headers",
    "problem",
    "problem_body",
    "problem_headers",
    "rejection",
    "text_headers",
    "too_many_requests_body",
    "too_many_requests_problem",
    "unavailable_answer",
]


class HeaderOptions:
    """When and which rate-limit headers a door sends, decided here once from its ``headers`` and
    ``header_style`` options: the doors read ``with_429`` and ``always`` instead of comparing the
    modes themselves.

    Args:
        mode: ``"always"`` (allowed answers too), ``"on_limit"`` (429 answers only) or ``"off"``.
        style: ``"both"``, ``"ietf"`` (``RateLimit``/``RateLimit-Policy``) or ``"legacy"`` (``X-RateLimit-*``).

    Raises:
        ConfigurationError: An unknown mode or style.
    """

    __slots__ = ("always", "mode", "style", "with_429")

    def __init__(self, mode: HeaderMode = "always", style: HeaderStyle = "both") -> None:
        check_header_options(mode, style)
        self.mode: HeaderMode = mode
        self.style: HeaderStyle = style
        self.with_429 = mode != "off"  # the rate-limit headers go on a 429
        self.always = mode == "always"  # and on every allowed answer

    def allowed_headers(self, decision: Decision, policy: bytes | None = None) -> list[tuple[bytes, bytes]]:
        """The rate-limit headers of an allowed answer (none unless ``always``)."""
        return rate_limit_headers(decision, self.style, policy) if self.always else []


def problem(status: int, title: str, detail: str, **extra: Any) -> dict[str, Any]:
    """An RFC 9457 problem object.

    Args:
        status: The HTTP status.
        title: A short summary of the problem type.
        detail: This occurrence, explained.
        **extra: Further members (e.g. ``retry_after``).
    """
    return {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}


def problem_body(status: int, title: str, detail: str, **extra: Any) -> bytes:
    """``problem`` encoded as JSON.

    Args:
        status: The HTTP status.
        title: A short summary of the problem type.
        detail: This occurrence, explained.
        **extra: Further members.
    """
    return json.dumps(problem(status, title, detail, **extra)).encode()


UNAVAILABLE_BODY = problem_body(503, "Service Unavailable", "The rate limiter is unavailable; try again shortly.")
"""The fail-closed answer's body (the store or a key function failed)."""


UNAVAILABLE_HEADERS = (
    (b"content-type", b"application/problem+json"),
    (b"content-length", b"%d" % len(UNAVAILABLE_BODY)),
    (b"retry-after", b"1"),
)
"""The fail-closed answer's complete header list."""


def unavailable_answer(exc: BaseException) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """``(status, body, complete header list)`` answering a check that raised ``exc`` (a
    ``LimitUnavailable``): 400 naming the problem for an ``AmbiguousRequest`` (the client can fix
    it; retrying the same request cannot), else the fail-closed 503.

    Args:
        exc: What the check raised.
    """
    if isinstance(exc, AmbiguousRequest):
        body = problem_body(400, "Bad Request", str(exc))
        return 400, body, problem_headers(body)
    return 503, UNAVAILABLE_BODY, list(UNAVAILABLE_HEADERS)


def too_many_requests_body(decision: Decision, group: str | None = None) -> bytes:
    """The 429 problem as JSON bytes.

    Args:
        decision: The denying decision.
        group: See ``too_many_requests_problem``.
    """
    return json.dumps(too_many_requests_problem(decision, group)).encode()


_Headers = list[tuple[bytes, bytes]]
_rejections: dict[tuple[object, ...], tuple[bytes, tuple[tuple[bytes, bytes], ...]]] = {}
_REJECTIONS_LIMIT = 4096
# A default 429 (problem+json body and every header) is about 2 KB: 4 KiB an entry keeps each one
# (the default 1 KiB share re-encoded every 429, 2.3x its cost), 16 MiB at most.
_REJECTIONS_BYTES = 16 << 20


def rejection(
    decision: Decision,
    headers: HeaderOptions,
    policy: bytes | None = None,
    group: str | None = None,
) -> tuple[bytes, _Headers]:
    """The 429 body and its complete header list (content type and length included).

    Both depend only on a few small integers of the decision, so they are built once and reused:
    a flood of rejections costs a dictionary lookup each, not a JSON encoding. The header list is a
    fresh copy every time, since outer middleware may append to it.

    Args:
        decision: The denying decision.
        headers: Which rate-limit headers, if any, go with it.
        policy: The ``RateLimit-Policy`` value listing every limit that applied (``policy_of``); ``None``
            uses the deciding limit's.
        group: See ``too_many_requests_problem``.
    """
    style = headers.style
    with_rate_headers = headers.with_429
    retry = None if math.isinf(decision.retry_after) else max(1, math.ceil(decision.retry_after))
    cache_key = (
        decision.policy, decision.limit, decision.period, decision.remaining,
        math.ceil(decision.reset_after), retry, style, with_rate_headers, policy, group,
    )
    found = _rejections.get(cache_key)
    if found is None:
        body = too_many_requests_body(decision, group)
        complete = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", b"%d" % len(body)),
            *limited_headers(decision, headers, policy),
        ]
        found = (body, tuple(complete))
        remember(_rejections, cache_key, found, _REJECTIONS_LIMIT, _REJECTIONS_BYTES)
    return found[0], list(found[1])


def too_many_requests_problem(decision: Decision, group: str | None = None) -> dict[str, Any]:
    """The 429 problem object: what was exceeded and when to retry.

    Args:
        decision: The denying decision.
        group: ``None`` for the default body; a string for the policy middleware's, which adds
            ``remaining`` and, when not empty, the caller's ``group`` (named in ``detail`` too).
    """
    if math.isinf(decision.retry_after):
        detail = f"This request costs more than the limit of {decision.limit} allows; it can never be served."
        retry: int | None = None
    else:
        retry = max(1, math.ceil(decision.retry_after))
        detail = f"Rate limit of {decision.limit} per {decision.period:g}s exceeded; retry after {retry}s."
    if group is None:
        return problem(429, "Too Many Requests", detail, policy=decision.policy, limit=decision.limit, retry_after=retry)
    extra: dict[str, Any] = {
        "policy": decision.policy,
        "limit": decision.limit,
        "remaining": decision.remaining,
        "retry_after": retry,
    }
    if group:
        extra["group"] = group
        detail = f"{detail[:-1]} (group {group!r})."
    return problem(429, "Too Many Requests", detail, **extra)


def limited_headers(
    decision: Decision, options: HeaderOptions, policy: bytes | None = None
) -> list[tuple[bytes, bytes]]:
    """Headers for a 429: the rate-limit headers (if ``options`` send them there) and ``Retry-After``.

    Args:
        decision: The denying decision.
        options: Which rate-limit headers, if any.
        policy: The ``RateLimit-Policy`` value listing every limit that applied (``policy_of``); ``None``
            uses the deciding limit's.
    """
    headers = rate_limit_headers(decision, options.style, policy) if options.with_429 else []
    retry = retry_after_header(decision)
    if retry is not None:
        headers.append(retry)
    return headers


def problem_headers(body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> list[tuple[bytes, bytes]]:
    """The complete header list of a problem+json answer: content type and length, then ``headers``.

    Args:
        body: The JSON body.
        headers: More headers.
    """
    return [
        (b"content-type", b"application/problem+json"),
        (b"content-length", b"%d" % len(body)),
        *(headers or ()),
    ]


#: A gateway's answer: both styles, on allowed answers too.
_GATEWAY = HeaderOptions("always", "both")
#: The headers whose value changes with every answer: decoded each time, never remembered.
_CHANGING = {b"ratelimit": "ratelimit", b"x-ratelimit-remaining": "x-ratelimit-remaining"}
_texts: dict[tuple[bytes, bytes], tuple[str, str]] = {}


def text_headers(
    decision: Decision, policies: tuple[Limit | tuple[str, int], ...], refused: bool,
    cache: dict[tuple[Limit | tuple[str, int], ...], bytes],
) -> list[tuple[str, str]]:
    """The rate-limit headers (both styles) of ``decision`` as text, for a protocol that carries text
    (gRPC, JSON): a ``refused`` answer's are ``limited_headers``' (``Retry-After`` included), an
    allowed one's ``allowed_headers``'; ``RateLimit-Policy`` lists ``policies``.

    Args:
        decision: The decision of the limit closest to it, its ``policy`` that limit's name.
        policies: Every limit that applied; a limit of 0 as ``(name, period)`` (``q=0``).
        refused: Whether the request is refused by ``decision``.
        cache: The ``RateLimit-Policy`` values already written, by ``policies``.
    """
    policy = cache.get(policies)
    if policy is None:
        policy = b", ".join(
            policy_value((item,)) if isinstance(item, Limit) else b'"%s";q=0;w=%d' % (item[0].encode("latin-1", "replace"), item[1])
            for item in policies
        )
        remember(cache, policies, policy, 1024)
    written = limited_headers(decision, _GATEWAY, policy) if refused else _GATEWAY.allowed_headers(decision, policy)
    out: list[tuple[str, str]] = []
    for pair in written:  # the ones that repeat from answer to answer (a policy, a limit, a reset second) decoded once
        found = _texts.get(pair)
        if found is None:
            name = _CHANGING.get(pair[0])
            if name is not None:
                out.append((name, pair[1].decode("latin-1")))
                continue
            found = (pair[0].decode("latin-1"), pair[1].decode("latin-1"))
            remember(_texts, pair, found, 4096, 4 << 20)
        out.append(found)
    return out
