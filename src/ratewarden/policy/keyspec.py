"""The key-spec language of policy files: ``ip``, ``identity``, ``header:<Name>``, ``bearer``,
``query:<name>``, parsed in one place for a rule's or the bans' ``key`` (who is charged) and for
the identity's ``sources`` (where an API key is read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol, get_args

from ..credentials import bearer_token_of, header_value, query_value
from ..errors import ConfigurationError
from ..keys import KeyFunc, bearer_token, client_ip, header, query_param
from ..types import Scope

__all__ = [
    "KEY_KINDS", "SOURCE_KINDS", "Extractor", "IdentityKey", "KeyKind", "key_function", "parse_key_spec", "parse_source",
]

KeyKind = Literal["ip", "identity", "header", "bearer", "query"]
KEY_KINDS: tuple[KeyKind, ...] = get_args(KeyKind)
SOURCE_KINDS: tuple[KeyKind, ...] = ("header", "bearer", "query")
Extractor = Callable[[Scope], "str | None"]


class IdentityKey(Protocol):
    """What ``key = "identity"`` needs of the policy's ``[identity]`` (a ``tiers.Identity``, which
    reads its sources with ``parse_source`` from here): the caller's storage key."""

    def key(self, scope: Scope) -> str: ...


_WITH_ARGUMENT = ("header", "query")
_FORMS = {"ip": "'ip'", "identity": "'identity'", "header": "'header:<Name>'", "bearer": "'bearer'", "query": "'query:<name>'"}


def parse_key_spec(spec: str, kinds: Sequence[KeyKind] = KEY_KINDS, what: str = "key") -> tuple[KeyKind, str]:
    """``(kind, argument)`` of ``spec`` (kind lower-cased, both stripped), or a ``ConfigurationError``
    naming the forms ``kinds`` allows; ``what`` names the spec in that message."""
    kind, _, arg = spec.partition(":")
    kind = kind.strip().lower()
    arg = arg.strip()
    for allowed in kinds:
        if kind == allowed and bool(arg) == (allowed in _WITH_ARGUMENT):
            return allowed, arg
    forms = [_FORMS[k] for k in kinds]
    listed = f"{', '.join(forms[:-1])} or {forms[-1]}" if len(forms) > 1 else forms[0]
    raise ConfigurationError(f"invalid {what} {spec!r}: use {listed}")


def key_function(spec: str, identity: IdentityKey | None) -> KeyFunc:
    """The key function a rule's or the bans' ``key = "<spec>"`` stands for."""
    kind, arg = parse_key_spec(spec)
    if kind == "identity":
        if identity is None:
            raise ConfigurationError("key 'identity' needs an [identity] section")
        return identity.key
    if kind == "header":
        return header(arg)
    if kind == "bearer":
        return bearer_token()
    if kind == "query":
        return query_param(arg)
    return client_ip


def parse_source(spec: str) -> Extractor:
    """An identity source (``header:<Name>``, ``bearer`` or ``query:<name>``) as a function
    returning the API key it finds in a request, or ``None``."""
    kind, arg = parse_key_spec(spec, SOURCE_KINDS, "key source")
    if kind == "header":
        return _header_source(arg.lower().encode("latin-1"))
    if kind == "query":
        return _query_source(arg)
    return bearer_token_of


def _header_source(name: bytes) -> Extractor:
    def extract(scope: Scope) -> str | None:
        value = header_value(scope, name)
        return (value.strip() or None) if value is not None else None

    return extract


def _query_source(name: str) -> Extractor:
    def extract(scope: Scope) -> str | None:
        return query_value(scope, name)

    return extract
