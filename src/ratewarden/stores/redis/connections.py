"""Sending a pipeline of script calls and reading every reply.

* ``PackedConnections`` (standalone, Sentinel): packed commands written on connections of our
  own, one per pipeline in flight, replies read straight from the parser; runs of single-key
  checks go as one script call each (``batching``).
* ``ClusterConnections``: calls routed by redis-py's cluster pipeline (one connection per node).

Both return one reply per call, an error reply as its exception, and send ``NOSCRIPT`` calls
again as ``EVAL`` (once per server, after a restart or failover). Both measure the server clock's
offset (``prepare``) before the first pipeline is sent, so that every script carries its deadline;
behind twemproxy (``twemproxy=1``, ``ScriptClock.proxied``) neither measures nor loads: its scripts
go without a deadline, by ``EVAL`` after ``NOSCRIPT``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._redis import NoScriptError, ReadOnlyError, RedisConnectionError, RedisError, ResponseError
from .batching import BATCH_SCRIPT, fold, spread
from .client import arrivals, new_connection, reply_reader
from .clock import ScriptClock
from .protocol import SCRIPT, SCRIPT_SHA, Reply, as_eval

if TYPE_CHECKING:
    from .pipeline import Exchange

__all__ = ["ClusterConnections", "PackedConnections", "eval_script"]


async def eval_script(client: Any, keys: Sequence[str], args: list[str]) -> Reply:
    """One script call through ``client``: ``EVALSHA``, else ``EVAL`` after ``NOSCRIPT``."""
    try:
        return await client.execute_command("EVALSHA", SCRIPT_SHA, len(keys), *keys, *args)
    except NoScriptError:
        return await client.execute_command("EVAL", SCRIPT, len(keys), *keys, *args)


class PackedConnections:
    """Our own connections for packed pipelines (standalone, Sentinel); idle ones are reused."""

    def __init__(self, client: Any, clock: ScriptClock) -> None:
        self.client = client
        self.clock = clock
        self.idle: list[Any] = []
        self.made: list[Any] = []  # every connection of ours, idle or in flight: close ends them all

    async def execute(self, commands: list[bytes], exchange: Exchange) -> list[Reply]:
        """Send packed ``EVALSHA`` commands on one connection of ours and read every reply,
        telling ``exchange`` when they are written and what the connection receives.
        A connection that fails before any reply was read (e.g. left stale by a server restart)
        is reconnected and tried once more, as redis-py's own retry does."""
        conn = self._take()
        try:
            for attempt in (0, 1):
                replies: list[Reply] = []
                try:
                    await self._connect(conn, exchange)
                    commands = exchange.fresh(commands)
                    exchange.sent(arrivals(conn))  # before the write: a reply may arrive during its drain
                    await self._exchange(conn, commands, replies)
                    break
                except (RedisConnectionError, OSError):
                    await conn.disconnect(nowait=True)
                    if attempt or replies:
                        raise
            if any(isinstance(r, ReadOnlyError) for r in replies):
                await conn.disconnect()  # a demoted primary: reconnecting asks Sentinel again
            missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
            if missing:
                # The server lost the script (SCRIPT FLUSH): load it once, then send those calls
                # again by its hash with a fresh deadline; EVAL each only if loading is refused.
                loaded = not self.clock.proxied and await _load_script(conn)
                resend = exchange.fresh([commands[i] for i in missing])
                again: list[Reply] = []
                await self._exchange(conn, resend if loaded else [as_eval(c) for c in resend], again)
                for i, reply in zip(missing, again, strict=False):
                    replies[i] = reply
        except BaseException:
            await conn.disconnect(nowait=True)  # replies may be left unread: never reuse it as is
            self.idle.append(conn)
            raise
        self.idle.append(conn)
        return replies

    async def prepare(self) -> None:
        """Connect a connection (measuring the server clock on it) for the first pipeline."""
        conn = self._take()
        try:
            await self._connect(conn)
        except BaseException:
            await conn.disconnect(nowait=True)
            self.idle.append(conn)
            raise
        self.idle.append(conn)

    def _take(self) -> Any:
        """An idle connection, else a new one (remembered, so ``close`` ends it)."""
        if self.idle:
            return self.idle.pop()
        conn = new_connection(self.client)
        self.made.append(conn)
        return conn

    async def _connect(self, conn: Any, exchange: Exchange | None = None) -> None:
        if not conn.is_connected:
            if exchange is not None:
                exchange.connecting(conn)
            await conn.connect()  # not left to send_packed_command: Sentinel's connect() finds the primary
            if exchange is not None:  # from here on, round trips the server answers (or not)
                exchange.sent(arrivals(conn))
            await self.clock.measure(lambda: _server_time(conn))  # a new connection may be a new server
            # A new server (started, restarted, failed over) lacks the script: loading it here
            # keeps a burst of first checks from each coming back NOSCRIPT and being sent again
            # with the whole script (a pipeline of 500 EVALs is 5 MB).
            if not self.clock.proxied:
                await _load_script(conn)

    async def _exchange(self, conn: Any, commands: list[bytes], replies: list[Reply]) -> None:
        """Write ``commands`` (runs of single-key checks folded, unless behind twemproxy) and add
        each one's reply to ``replies`` as it is read: a failure midway leaves those read."""
        await self._connect(conn)
        sent, sizes = fold(commands) if not self.clock.proxied else (commands, [0] * len(commands))
        await conn.send_packed_command(sent, check_health=False)
        read = reply_reader(conn)
        for size in sizes:
            try:
                reply = await read()
            except ResponseError as exc:
                reply = exc
            replies.extend(spread(reply, size))

    async def close(self) -> None:
        """Disconnect every connection of ours, in flight ones too (a later pipeline connects
        again)."""
        for conn in self.made:
            with contextlib.suppress(RedisError, OSError):
                await conn.disconnect()


async def _load_script(conn: Any) -> bool:
    """``SCRIPT LOAD`` the check script, and the script of folded checks, on ``conn``'s server:
    whether both were loaded (an ACL may refuse the command; ``EVAL`` then remains)."""
    loaded = True
    for script in (SCRIPT, BATCH_SCRIPT):
        await conn.send_command("SCRIPT", "LOAD", script, check_health=False)
        try:
            reply = await conn.read_response()
        except ResponseError:
            return False
        loaded = loaded and not isinstance(reply, ResponseError)
    return loaded


async def _server_time(conn: Any) -> Any:
    await conn.send_command("TIME", check_health=False)
    return await conn.read_response()


class ClusterConnections:
    """Script calls through redis-py's cluster pipeline, which routes each to its slot's node."""

    def __init__(self, client: Any, clock: ScriptClock) -> None:
        self.client = client
        self.clock = clock

    async def prepare(self) -> None:
        """Measure the server clock (on the client's default node): the quicker of two samples,
        as the first one also discovers the cluster and connects; then load the script on every
        primary, so that a burst of first checks does not come back ``NOSCRIPT``."""
        await self.clock.measure(self.client.time, samples=2)
        await self._load_script()

    async def _load_script(self) -> bool:
        try:
            await self.client.execute_command("SCRIPT LOAD", SCRIPT)  # every primary
        except ResponseError:
            return False  # refused (an ACL): EVAL remains
        return True

    async def execute(self, requests: list[tuple[Sequence[str], list[str]]], exchange: Exchange) -> list[Reply]:
        """Send the calls through redis-py's cluster pipeline (its connections are its own: no
        arrivals are known, so a timeout is judged by our loop's lag alone)."""
        requests = exchange.fresh(requests)
        exchange.sent(None)
        if len(requests) == 1:
            try:
                return [await eval_script(self.client, *requests[0])]
            except ResponseError as exc:  # a reply, as the pipeline gives it (e.g. refused as late)
                return [exc]
        pipe = self.client.pipeline(transaction=False)
        for keys, args in requests:
            pipe.execute_command("EVALSHA", SCRIPT_SHA, len(keys), *keys, *args)
        replies: list[Reply] = await pipe.execute(raise_on_error=False)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            # A node lost the script (restarted, failed over, flushed): load it on every primary
            # and send those calls again by hash with a fresh deadline (EVAL if loading is
            # refused), as one pipeline (one connection per node), not one call per check, which
            # would exhaust the nodes' connection pools.
            command = "EVALSHA" if await self._load_script() else "EVAL"
            body = SCRIPT_SHA if command == "EVALSHA" else SCRIPT
            resend = exchange.fresh([requests[i] for i in missing])
            pipe = self.client.pipeline(transaction=False)
            for keys, args in resend:
                pipe.execute_command(command, body, len(keys), *keys, *args)
            again = await pipe.execute(raise_on_error=False)
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def close(self) -> None:
        """Nothing of ours: the client's own pools are closed with it."""
