"""Deleting keys on Redis for ``RedisStore.reset`` and ``clear``: one DEL, or one a key on a cluster
(whose keys may live in several slots), each in a turn of the store's connection gate."""

from __future__ import annotations

import asyncio
from typing import Any

from .gate import ConnectionGate, Turn

__all__ = ["delete_keys", "delete_prefixed"]


async def delete_keys(client: Any, gate: ConnectionGate, turn: Turn, cluster: bool, keys: list[Any]) -> None:
    """Delete ``keys``: one DEL, or one a key on a cluster."""
    if cluster:
        await asyncio.gather(*(gate.run(turn, client.delete, key) for key in keys))
    else:
        await gate.run(turn, client.delete, *keys)


async def delete_prefixed(client: Any, gate: ConnectionGate, cluster: bool, prefix: str) -> None:
    """Delete every ``<prefix>:*`` key (on every primary of a cluster): SCAN a page at a time (a
    SCAN call in a turn of the gate when the last page is used up), DEL 500 keys at a time. Not
    bounded by the store's timeout: a large keyspace takes long."""
    turn = Turn()
    batch: list[Any] = []
    keys = client.scan_iter(match=f"{prefix}:*", count=1000).__aiter__()
    while True:
        async with gate.slot(turn):
            try:
                key = await keys.__anext__()
            except StopAsyncIteration:
                break
        batch.append(key)
        if len(batch) >= 500:
            await delete_keys(client, gate, turn, cluster, batch)
            batch = []
    if batch:
        await delete_keys(client, gate, turn, cluster, batch)
