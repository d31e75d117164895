"""The options every rate-limit middleware (ASGI, WSGI, the policy ones) takes alike, checked when
it is built."""

from __future__ import annotations

from ..errors import ConfigurationError
from ..headers import HeaderMode, HeaderStyle

__all__ = ["check_header_options"]


def check_header_options(headers: HeaderMode, header_style: HeaderStyle) -> None:
    """Raise ``ConfigurationError`` unless ``headers`` and ``header_style`` are values a middleware knows.

    Args:
        headers: When to send the rate-limit headers: ``"always"``, ``"on_limit"`` or ``"off"``.
        header_style: Which rate-limit headers: ``"both"``, ``"ietf"`` or ``"legacy"``.
    """
    if headers not in ("always", "on_limit", "off"):
        raise ConfigurationError(f"headers must be 'always', 'on_limit' or 'off', got {headers!r}")
    if header_style not in ("ietf", "legacy", "both"):
        raise ConfigurationError(f"header_style must be 'ietf', 'legacy' or 'both', got {header_style!r}")
