"""Memcached's text protocol: the commands the store sends and the readers of their replies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from ._aiomcache import ClientException

Read = tuple["bytes | None", "int | None"]  # a value and its CAS token (None: no such key)

_STORAGE_REPLIES = (b"STORED", b"NOT_STORED", b"EXISTS", b"NOT_FOUND")


def storage(command: bytes, key: bytes, data: bytes, exptime: int, token: int | None = None) -> bytes:
    head = b"%s %s 0 %d %d" % (command, key, exptime, len(data))
    if token is not None:
        head += b" %d" % token
    return head + b"\r\n" + data + b"\r\n"


def write_command(key: bytes, data: bytes, token: int | None, exptime: int) -> bytes:
    """``add`` for a key not there (no token), else ``cas``."""
    return storage(b"add", key, data, exptime) if token is None else storage(b"cas", key, data, exptime, token)


async def _line(reader: asyncio.StreamReader) -> bytes:
    line = await reader.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionResetError("memcached closed the connection")
    return line[:-2]


def values_reader(keys: Sequence[bytes]) -> Callable[[asyncio.StreamReader], Awaitable[list[Read]]]:
    """The reader of a ``get``/``gets`` reply for ``keys``: their (value, token) in that order."""

    async def read(reader: asyncio.StreamReader) -> list[Read]:
        found: dict[bytes, Read] = {}
        while True:
            line = await _line(reader)
            if line == b"END":
                return [found.get(k, (None, None)) for k in keys]
            terms = line.split()
            if len(terms) < 4 or terms[0] != b"VALUE":
                raise ClientException("get failed", line)
            data = await reader.readexactly(int(terms[3]) + 2)
            found[terms[1]] = (data[:-2], int(terms[4]) if len(terms) > 4 else None)

    return read


async def stored(reader: asyncio.StreamReader) -> bool:
    line = await _line(reader)
    if line not in _STORAGE_REPLIES:
        raise ClientException("store failed", line)
    return line == b"STORED"


async def deleted(reader: asyncio.StreamReader) -> bool:
    line = await _line(reader)
    if line not in (b"DELETED", b"NOT_FOUND"):
        raise ClientException("delete failed", line)
    return line == b"DELETED"


async def ok(reader: asyncio.StreamReader) -> bool:
    line = await _line(reader)
    if line != b"OK":
        raise ClientException("flush_all failed", line)
    return True
