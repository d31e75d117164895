"""What Envoy's rate limit service is asked and answers, framework-free: a request's descriptors
(``RequestDescriptor``), a status per descriptor (``DescriptorStatus``, ``CurrentLimit``), the answer
(``RlsAnswer``) and the error of a request it cannot answer (``RlsRequestError``). ``serve.grpc``
translates them from and to the protobuf, ``serve.rls`` from and to the core's items
(``enforcement.charge_strategies``), which decide."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from .._mypyc import mypyc_attr
from ..errors import RatewardenError

__all__ = ["UINT32_MAX", "Code", "CurrentLimit", "DescriptorStatus", "RequestDescriptor", "RlsAnswer", "RlsRequestError"]

UINT32_MAX = 2**32 - 1
Code = Literal["OK", "OVER_LIMIT"]


@mypyc_attr(allow_interpreted_subclasses=True)
class RlsRequestError(RatewardenError, ValueError):
    """A request the service cannot answer (empty domain, no descriptors, an empty entry...)."""


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass(frozen=True)
class RequestDescriptor:
    """One descriptor of a request.

    Args:
        entries: ``(key, value)`` pairs, in order.
        limit: The per-descriptor override ``(requests_per_unit, unit)`` (``unit`` as in the
            configuration: ``"second"`` ... ``"year"``), or ``None``.
        hits_addend: This descriptor's cost (0 only checks); ``None`` uses the request's.
    """

    entries: tuple[tuple[str, str], ...]
    limit: tuple[int, str] | None = None
    hits_addend: int | None = None


class CurrentLimit(NamedTuple):
    """The limit a status reports (``RateLimitResponse.RateLimit``): made once per configured limit."""

    name: str
    requests_per_unit: int
    unit: str


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass
class DescriptorStatus:
    """The answer for one descriptor.

    Args:
        code: ``"OK"`` or ``"OVER_LIMIT"``.
        current_limit: The limit applied; ``None`` when none (no match, unlimited, replaced).
        limit_remaining: Units left (``UINT32_MAX`` for unlimited).
        duration_until_reset: Seconds until the limit is fully restored.
        shadowed: A ``shadow_mode`` limit that was over (its code stays ``"OK"``, as in the Go service).
    """

    code: Code
    current_limit: CurrentLimit | None = None
    limit_remaining: int = 0
    duration_until_reset: float = 0.0
    shadowed: bool = False


@mypyc_attr(allow_interpreted_subclasses=True)
@dataclass
class RlsAnswer:
    """A ``ShouldRateLimit`` answer.

    Args:
        overall_ok: ``False`` when an enforced descriptor is over its limit.
        statuses: One per request descriptor, in order.
        headers: ``RateLimit``/``RateLimit-Policy`` and ``X-RateLimit-*`` (plus ``Retry-After``
            when over) for the descriptor closest to its limit; empty when nothing was limited.
    """

    overall_ok: bool
    statuses: list[DescriptorStatus]
    headers: list[tuple[str, str]] = field(default_factory=list)
