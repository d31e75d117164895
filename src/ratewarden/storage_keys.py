"""Storage keys: how a (prefix, namespace, client key, limit) is named in a store, with whatever a
client sends kept bounded."""

from __future__ import annotations

import hashlib

__all__ = ["MAX_KEY_LENGTH", "safe_key", "storage_key"]

#: Longer client keys are stored (and cached) under their hash (``safe_key``).
MAX_KEY_LENGTH = 200


def safe_key(key: str) -> str:
    """``key`` itself, or its hash when it is over-long or holds braces (which would break the
    Redis Cluster hash tag), so whatever a client sends stays bounded.

    Args:
        key: The key a client sent.
    """
    if len(key) > MAX_KEY_LENGTH or "}" in key or "{" in key:
        return "h." + hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return key


def storage_key(prefix: str, namespace: str, key: str, suffix: str = "") -> str:
    """``prefix:{namespace|key}:suffix``, the one place storage keys are built (the limiter, compiled
    rules and bans all call it, so ``Limiter.reset`` reaches what a rule charged). The braces are
    a Redis Cluster hash tag, so every limit of one (namespace, key) shares a slot; braces in
    ``namespace`` (route templates such as ``/items/{item_id}``) become parentheses so they cannot cut
    the tag short.

    Args:
        prefix: The limiter's prefix.
        namespace: What the key is counted within (a route template, a rule name), or ``""``.
        key: Who is limited (passed through ``safe_key``).
        suffix: Which limit: ``Limit.suffix``; ``""`` for none (bans).
    """
    if "{" in namespace or "}" in namespace:
        namespace = namespace.replace("{", "(").replace("}", ")")
    base = f"{prefix}:{{{namespace}|{safe_key(key)}}}"
    return f"{base}:{suffix}" if suffix else base
