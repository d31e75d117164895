"""Matching a request's descriptor against a domain's tree, as envoyproxy/ratelimit does.

At each level of the tree, an entry ``(key, value)`` matches, in order: the child ``key_value``,
else the first wildcard child (in file order) whose ``key_value`` pattern matches (a pattern ends
in ``*`` and matches what starts with the rest; a ``*`` before the end is literal, as in the Go
service at the commit ``bench.gateway_peers.REFERENCE_VERSION`` pins), else the child ``key`` (any value). The limit applies only when
the request's last entry lands on a descriptor with a ``rate_limit``: a request with more
entries than the tree is deep matches nothing.

``entries_key`` is what a matched descriptor's counter is named by (its client key).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple
from urllib.parse import quote

from .envoy_config import EnvoyDescriptor, EnvoyDomain, EnvoyRateLimit

__all__ = ["Match", "entries_key", "escape", "match_descriptor", "wildcard_match"]


class Match(NamedTuple):
    """A matched limit (a tuple: made for every request descriptor that matches).

    Args:
        rate_limit: The configured limit.
        shared: ``{entry index: wildcard value pattern}`` for entries matched by a wildcard with
            ``share_threshold`` (their counter uses the pattern, not the request's value).
    """

    rate_limit: EnvoyRateLimit
    shared: dict[int, str]


def wildcard_match(parts: Sequence[str], value: str) -> bool:
    """Whether ``value`` matches a pattern split at its ``*`` (the Go service's ``wildcardMatch``).

    Args:
        parts: The pattern split on ``*``.
        value: The request's ``key_value``.
    """
    if len(parts) == 1:
        return parts[0] == value
    first, last = parts[0], parts[-1]
    if not value.startswith(first) or not value.endswith(last):
        return False
    if len(value) < sum(len(part) for part in parts):
        return False
    remaining = value[len(first):]
    if last:
        remaining = remaining[: len(remaining) - len(last)]
    for part in parts[1:-1]:
        found = remaining.find(part)
        if found < 0:
            return False
        remaining = remaining[found + len(part):]
    return True


def match_descriptor(domain: EnvoyDomain, entries: Sequence[tuple[str, str]]) -> Match | None:
    """The limit a request descriptor selects in ``domain``, or ``None``.

    Args:
        domain: The loaded configuration.
        entries: The descriptor's ``(key, value)`` entries, in order.
    """
    children = domain.root.children
    previous: EnvoyDescriptor = domain.root
    found: EnvoyRateLimit | None = None
    shared: dict[int, str] = {}
    last = len(entries) - 1
    for index, (key, value) in enumerate(entries):
        final_key = f"{key}_{value}"
        node = children.get(final_key)
        wildcard = ""
        if node is None and previous.wildcards:
            for pattern, parts in previous.wildcards:
                if wildcard_match(parts, final_key):
                    node = children.get(pattern)
                    wildcard = pattern
                    break
        if node is None:
            node = children.get(key)
        if node is None:
            break
        if wildcard and node.share_threshold:
            shared[index] = wildcard[len(key) + 1:] if wildcard.startswith(key + "_") else wildcard
        if node.rate_limit is not None and index == last:
            found = node.rate_limit
        if not node.children:
            break
        children = node.children
        previous = node
    if found is None:
        return None
    return Match(found, shared)


def entries_key(entries: Sequence[tuple[str, str]], shared: Mapping[int, str]) -> str:
    """The descriptor's part of its storage key (the client key ``storage_key`` is given):
    ``key=value&key=value``, each part escaped, with the wildcard pattern in place of the value for
    a ``share_threshold`` entry.

    Args:
        entries: The request descriptor's entries.
        shared: The wildcard pattern of each ``share_threshold`` entry, by its index.
    """
    if shared:
        return "&".join(f"{escape(k)}={escape(shared.get(i, v))}" for i, (k, v) in enumerate(entries))
    return "&".join(f"{escape(k)}={escape(v)}" for k, v in entries)


_PLAIN = re.compile(r"[A-Za-z0-9_.~-]*")


def escape(text: str) -> str:
    """``text`` percent-escaped (``&``, ``=``, ``%`` and braces included); plain text as it is.

    Args:
        text: A domain, an entry's key or value.
    """
    return text if _PLAIN.fullmatch(text) else quote(text, safe="")
