"""Tiers: who the caller is (an API key from one of several places), which group that puts them in,
and rules whose limits come from the group.

``Identity`` tries each source in order (``header:X-API-Key``, ``bearer``, ``query:api_key``);
the key found is looked up exactly, then by SHA-256 hash, then by glob pattern. A listed key gets
its group; an unlisted key gets ``unknown_group``; no key at all gets ``anonymous_group`` and is
charged per client address. Keys are stored only as digests, never as the secret itself.

A ``PolicyRule`` with ``tiers`` has one precompiled rule per group (named ``<rule>.<group>``, which
is also its storage scope), so picking the limits is a dict lookup per request.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any

from ..charges import Charge
from ..context import RequestContext, context_of
from ..credentials import digest
from ..errors import ConfigurationError
from ..keys import KeyFunc, client_ip, key_text
from ..rates import Rate
from ..rules import CompiledRule, Rule
from ..types import Scope
from .delay import Delay
from .keyspec import parse_source

__all__ = ["Identity", "IdentityContext", "PolicyRule", "Tiers", "parse_source"]

_CACHE_LIMIT = 10_000
_CACHE_CHARS = 4 * 1024 * 1024
"""Characters of API keys the identity cache may hold in all: the keys are what clients send, so
the cache is bounded in bytes as well as in entries (10,000 keys of 64 KB would be 640 MB)."""


class Identity:
    """Finds the caller's API key and group.

    Args:
        sources: Where to look for the API key, in order: ``"header:<Name>"``, ``"bearer"`` or
            ``"query:<name>"``.
        keys: API key to group.
        hashed_keys: SHA-256 hex digest of an API key to group, so the file holds no secrets.
        patterns: Glob pattern of API keys to group, tried in order after ``keys`` and ``hashed_keys``.
        unknown_group: The group of an API key nothing matches.
        anonymous_group: The group of requests without an API key.
        anonymous_key: Who an anonymous request is (default: the client IP).
    """

    def __init__(
        self,
        sources: Iterable[str] = ("header:X-API-Key",),
        *,
        keys: Mapping[str, str] | None = None,
        hashed_keys: Mapping[str, str] | None = None,
        patterns: Mapping[str, str] | Iterable[tuple[str, str]] = (),
        unknown_group: str,
        anonymous_group: str,
        anonymous_key: KeyFunc = client_ip,
    ) -> None:
        self.sources = tuple(sources)
        self.extractors = tuple(parse_source(s) for s in self.sources)
        if not self.extractors:
            raise ConfigurationError("identity needs at least one key source (e.g. 'header:X-API-Key')")
        self.keys = dict(keys or {})
        self.hashed_keys = {h.lower(): g for h, g in (hashed_keys or {}).items()}
        pairs = patterns.items() if isinstance(patterns, Mapping) else patterns
        self.patterns = tuple((p, re.compile(fnmatch.translate(p)), g) for p, g in pairs)
        self.unknown_group = unknown_group
        self.anonymous_group = anonymous_group
        self.anonymous_key = anonymous_key
        self._cache: dict[str, tuple[str, str]] = {}
        self._cache_chars = 0  # characters of the keys in _cache

    @property
    def groups(self) -> set[str]:
        """Every group this identity can answer."""
        return {
            *self.keys.values(),
            *self.hashed_keys.values(),
            *(g for _, _, g in self.patterns),
            self.unknown_group,
            self.anonymous_group,
        }

    def group_of(self, api_key: str) -> str:
        """The group of a presented API key.

        Args:
            api_key: The key as presented.
        """
        group = self.keys.get(api_key)
        if group is not None:
            return group
        if self.hashed_keys:
            group = self.hashed_keys.get(hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).hexdigest())
            if group is not None:
                return group
        for _, regex, pattern_group in self.patterns:
            if regex.match(api_key):
                return pattern_group
        return self.unknown_group

    def api_key(self, scope: Scope) -> str | None:
        """The first API key found in the request, or ``None``.

        Args:
            scope: The ASGI connection scope.
        """
        for extract in self.extractors:
            value = extract(scope)
            if value:
                return value
        return None

    def client_key(self, api_key: str) -> str:
        """The storage key of an API key (a digest: secrets never reach the store).

        Args:
            api_key: The key as presented.
        """
        return "k:" + digest(api_key)

    def resolve(self, scope: Scope) -> tuple[str, str]:
        """``(group, client key)`` of this request (remembered in the request's context when it is an
        ``IdentityContext``, as ``PolicyMiddleware``'s is, so the group choice and the key function
        resolve it once).

        Args:
            scope: The ASGI connection scope.
        """
        found_context = context_of(scope)
        context = found_context if isinstance(found_context, IdentityContext) else None
        if context is not None:
            found = context.identity
            if found is not None and found[0] is self:
                return found[1]
        api_key = self.api_key(scope)
        if api_key is None:
            anon = self.anonymous_key(scope)
            if isinstance(anon, Awaitable):
                raise TypeError("identity anonymous_key must be a synchronous key function")
            result = (self.anonymous_group, "ip:" + key_text(anon, scope))
        else:
            cached = self._cache.get(api_key)
            if cached is None:
                cached = (self.group_of(api_key), self.client_key(api_key))
                size = len(api_key)
                if len(self._cache) >= _CACHE_LIMIT or self._cache_chars + size > _CACHE_CHARS:
                    self._cache.clear()
                    self._cache_chars = 0
                if size <= _CACHE_CHARS // 64:  # a key that would fill the cache alone is not kept
                    self._cache[api_key] = cached
                    self._cache_chars += size
            result = cached
        if context is not None:
            context.identity = (self, result)
        return result

    def key(self, scope: Scope) -> str:
        """Key function: the caller's storage key.

        Args:
            scope: The ASGI connection scope.
        """
        return self.resolve(scope)[1]

    def group(self, scope: Scope) -> str:
        """The caller's group.

        Args:
            scope: The ASGI connection scope.
        """
        return self.resolve(scope)[0]


class IdentityContext(RequestContext):
    """A request context that remembers the caller's identity once resolved (``PolicyMiddleware``'s
    ``PolicyContext`` is one); the attribute is the middleware's, not an API."""

    # (the Identity that resolved it, (group, storage key))
    identity: tuple[Identity, tuple[str, str]] | None = None


class Tiers:
    """Groups and their limits (``None`` = unlimited), with the ``Identity`` that picks the group.

    Args:
        groups: Group name to its rates (``None``: unlimited).
        identity: Picks each request's group.
    """

    def __init__(self, groups: Mapping[str, str | Rate | Iterable[str | Rate] | None], identity: Identity) -> None:
        if not groups:
            raise ConfigurationError("tiers need at least one group")
        missing = sorted(identity.groups - set(groups))
        if missing:
            raise ConfigurationError(f"identity refers to undefined group(s): {', '.join(missing)}")
        self.groups = dict(groups)
        self.identity = identity


class PolicyRule(Rule):
    """A ``Rule`` with the policy extras.

    Enforced by ``PolicyMiddleware`` (a plain ``RateLimitMiddleware`` ignores the tier limits).

    Args:
        path: Which paths, as for ``Rule``.
        rate: The rate, when ``tiers`` do not give it.
        tiers: Limits per group, instead of ``rate``.
        delay: Hold requests over the rate for a while instead of rejecting them at once.
        charge: Decides after the response whether the request counts.
        **kwargs: Those of ``Rule``.
    """

    def __init__(
        self,
        path: str | re.Pattern[str] = "/**",
        rate: str | Rate | Iterable[str | Rate] | None = None,
        *,
        tiers: Tiers | None = None,
        delay: Delay | None = None,
        charge: Charge | None = None,
        **kwargs: Any,
    ) -> None:
        if tiers is not None:
            if rate is not None:
                raise ConfigurationError(f"PolicyRule({path!r}): give either rate or tiers, not both")
            kwargs.setdefault("key", tiers.identity.key)
            super().__init__(path, "1/s", **kwargs)  # placeholder; the group decides the limits
            self.rate = None
            self.limits = ()
        else:
            super().__init__(path, rate, **kwargs)
        self.tiers = tiers
        self.delay = delay
        self.charge = charge
        self._group_rules: dict[str, dict[str, CompiledRule | None]] = {}

    def group_rules(self, prefix: str) -> dict[str, CompiledRule | None]:
        """One compiled rule per group (``None`` for unlimited groups), for storage ``prefix``.

        Args:
            prefix: The limiter's storage-key prefix.
        """
        found = self._group_rules.get(prefix)
        if found is None:
            assert self.tiers is not None
            found = {}
            for group, rates in self.tiers.groups.items():
                if rates is None:
                    found[group] = None
                    continue
                rule = PolicyRule(
                    self.path,
                    rates,
                    key=self.key,
                    algorithm=self.algorithm,
                    methods=self.methods,
                    name=f"{self.name}.{group}",
                    cost=self.cost,
                    shadow=self.shadow,
                    delay=self.delay,
                    charge=self.charge,
                )
                found[group] = CompiledRule(rule, prefix)
            self._group_rules[prefix] = found
        return found
