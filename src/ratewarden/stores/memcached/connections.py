"""The pool and its connections: arrivals counted per connection, connecting bounded.

A command's timer asks whether memcached was heard from since it started (see ``commands``):
each connection's reader counts the data fed to it, and ``readable`` sees bytes still waiting
unread in the kernel.
"""

from __future__ import annotations

import asyncio
import select
from typing import Any

from ._aiomcache import Connection, MemcachePool, aiomcache


class Heard:
    """How many times data arrived (on one connection, or on all of a store's)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


def heard_on(conn: Connection, store_heard: Heard) -> Heard:
    """The arrival counter of ``conn``, hooked into its reader's ``feed_data`` on first use."""
    reader = conn.reader
    heard: Heard | None = getattr(reader, "_rw_heard", None)
    if heard is None:
        heard = Heard()
        own = heard
        feed = reader.feed_data

        def counted(data: bytes) -> None:
            own.count += 1
            store_heard.count += 1
            feed(data)

        setattr(reader, "feed_data", counted)  # noqa: B010 - an instance attribute over the method
        setattr(reader, "_rw_heard", heard)  # noqa: B010
    return heard


def readable(conn: Connection) -> bool:
    """Whether bytes wait unread in the kernel for ``conn`` (our loop has not read them yet)."""
    sock = conn.writer.transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        fd = sock.fileno()
        if fd < 0:
            return False
        if hasattr(select, "poll"):  # no FD_SETSIZE limit (a busy server has fds above 1024)
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


class Pool(MemcachePool):
    """aiomcache's pool, with connecting bounded (a connect is not a command, so not re-armed)."""

    connect_timeout = 1.0

    async def _create_new_conn(self) -> Connection | None:
        return await asyncio.wait_for(super()._create_new_conn(), self.connect_timeout)


class Client(aiomcache.Client):
    closed = False  # then a command closes its connection when done


class Sent:
    """A command written on ``conn``, its reply read by ``task``."""

    __slots__ = ("conn", "heard", "seen", "task")

    def __init__(self, conn: Connection, heard: Heard, task: asyncio.Future[Any]) -> None:
        self.conn = conn
        self.heard = heard
        self.seen = heard.count
        self.task = task


def retrieve(task: asyncio.Future[Any]) -> None:
    """A done callback: ``task``'s exception is retrieved (nobody else will)."""
    if not task.cancelled():
        task.exception()
