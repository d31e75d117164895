"""Keys, states and expiry times as memcached takes them.

* Keys over 250 bytes, or with spaces, control or non-ASCII characters, are hashed (BLAKE2b).
* State: the algorithm's tuple of floats as ``repr`` values joined by commas (lossless).
* Expiry: ``ceil(reset_after) + 1`` seconds (memcached counts whole seconds, so the extra
  second stops a state from expiring early); above 30 days it is sent as an absolute Unix time.
"""

from __future__ import annotations

import hashlib
import math

from ...algorithms import State

THIRTY_DAYS = 30 * 86400
_MAX_KEY = 250


def memcached_key(key: str) -> bytes:
    """``key`` as memcached accepts it: hashed when too long or not plain printable ASCII.

    Args:
        key: A ratewarden storage key.
    """
    raw = key.encode("utf-8", "surrogatepass")
    if len(raw) <= _MAX_KEY and raw.isascii() and all(32 < b < 127 for b in raw):
        return raw
    prefix = key.split(":", 1)[0][:16] if ":" in key else "rw"
    safe_prefix = "".join(c for c in prefix if 32 < ord(c) < 127) or "rw"
    return f"{safe_prefix}:h:{hashlib.blake2b(raw, digest_size=20).hexdigest()}".encode()


def expiry(reset_after: float, wall: float) -> int:
    """Memcached ``exptime`` for a state meaningful for ``reset_after`` seconds."""
    seconds = max(1, math.ceil(reset_after) + 1) if reset_after < 1e12 else THIRTY_DAYS * 1000
    return seconds if seconds <= THIRTY_DAYS else int(wall) + seconds


def encode(state: State) -> bytes:
    return ",".join(map(repr, state)).encode()


def decode(value: bytes) -> State:
    if not value:
        return ()
    return tuple(float(x) for x in value.split(b","))
