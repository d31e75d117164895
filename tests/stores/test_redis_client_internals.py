"""Every redis-py internal that ``ratewarden.stores.redis.client`` relies on (its ``RELIED_ON``),
checked against the installed redis-py: a release that changes one fails here, naming the
redis-py version and the attribute, instead of breaking checks in production."""

from __future__ import annotations

import asyncio
import inspect
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel
from redis.exceptions import NoScriptError, ResponseError

from ratewarden.limits import make_limits
from ratewarden.stores.redis import RedisStore
from ratewarden.stores.redis.client import (
    RELIED_ON,
    ResolvingConnection,
    ResolvingSSLConnection,
    arrivals,
    new_connection,
    reply_reader,
    sentinel_clients,
)
from ratewarden.stores.redis.protocol import PackedCommands, ScriptArgs, as_eval, bulk, decision_at
from tests.servers import HOST, RedisSentinel, RedisStandalone

VERSION = redis.__version__


def broken(attribute: str, what: str) -> str:
    return (
        f"redis-py {VERSION} changed {attribute}: {what}. ratewarden.stores.redis.client relies on it "
        f"({RELIED_ON.get(attribute, 'public API used by ratewarden.stores.redis.connections')}); adapt the "
        "adapter or pin redis-py below this version."
    )


async def _read(read: Callable[[], Awaitable[Any]]) -> Any:
    """One reply; an error reply, whether returned or raised, as its exception."""
    try:
        return await read()
    except ResponseError as exc:
        return exc


async def test_make_connection_gives_a_new_connection_of_the_pools_class(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(redis_standalone.url, timeout=5, connect_timeout=2)
    pool = store.client.connection_pool
    try:
        assert callable(getattr(pool, "make_connection", None)), broken("ConnectionPool.make_connection", "missing")
        conn = pool.make_connection()
        assert isinstance(conn, ResolvingConnection), broken(
            "ConnectionPool.make_connection", f"gave a {type(conn).__name__}, not the pool's connection_class"
        )
        assert (conn.host, conn.port, conn.db) == (HOST, redis_standalone.port, 0), broken(
            "ConnectionPool.make_connection", "did not apply the pool's connection arguments"
        )
        assert not conn.is_connected
        again = pool.make_connection()
        assert again is not conn, broken("ConnectionPool.make_connection", "returned a shared connection")
        await again.connect()
        await again.disconnect()
        # The connection is not checked out: the pool still hands out its own connections.
        assert await asyncio.wait_for(store.client.ping(), 5)
    finally:
        await store.close()


async def test_make_connection_on_a_sentinel_pool_connects_to_the_primary(redis_sentinel: RedisSentinel) -> None:
    store = RedisStore(redis_sentinel.url, timeout=5, connect_timeout=2)
    try:
        conn = store.client.connection_pool.make_connection()
        await asyncio.wait_for(conn.connect(), 10)
        try:
            assert conn.port == redis_sentinel.master_port(), broken(
                "ConnectionPool.make_connection", "a SentinelConnectionPool's connection did not find the primary"
            )
        finally:
            await conn.disconnect()
    finally:
        await store.close()


async def test_sentinel_lists_a_client_per_sentinel(redis_sentinel: RedisSentinel) -> None:
    sentinel = aioredis.sentinel.Sentinel([(HOST, s.port) for s in redis_sentinel.sentinels])
    clients = sentinel_clients(sentinel)
    try:
        ports = sorted(client.connection_pool.connection_kwargs.get("port") for client in clients)
        assert ports == sorted(s.port for s in redis_sentinel.sentinels), broken(
            "Sentinel.sentinels", f"gave clients of ports {ports}, not one per Sentinel"
        )
        assert all(isinstance(client, aioredis.Redis) for client in clients), broken(
            "Sentinel.sentinels", f"holds {[type(c).__name__ for c in clients]}, not Redis clients"
        )
        assert await asyncio.wait_for(clients[0].ping(), 5)
    finally:
        for client in clients:
            await client.aclose()


async def test_socket_timeout_is_the_connections_own_attribute(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(redis_standalone.url, timeout=0.1, connect_timeout=3)
    try:
        conn = store.client.connection_pool.make_connection()
        assert getattr(conn, "socket_timeout", "missing") == 3.0, broken(
            "Connection.socket_timeout", f"is {getattr(conn, 'socket_timeout', 'missing')!r}, not the configured 3.0"
        )
        ours = new_connection(store.client)
        assert ours.socket_timeout is None
        await ours.connect()
        try:
            await ours.send_command("PING", check_health=False)
            assert await ours.read_response() == b"PONG", broken("Connection.socket_timeout", "None breaks an exchange")
        finally:
            await ours.disconnect()
    finally:
        await store.close()


async def test_the_parser_reads_replies_and_returns_error_replies(redis_standalone: RedisStandalone) -> None:
    store = RedisStore(redis_standalone.url, timeout=5)
    conn = new_connection(store.client)
    (limit,) = make_limits("3/min", "gcra")
    key = f"rw:{{internals|{id(conn)}}}:{limit.suffix}"
    check = PackedCommands(ScriptArgs(None)).request("h", [key], [limit], [1.0], bulk(""))
    try:
        await conn.connect()
        parser = getattr(conn, "_parser", None)
        assert parser is not None, broken("Connection._parser", "no parser on a connected connection")
        assert inspect.iscoroutinefunction(getattr(parser, "read_response", None)), broken(
            "_parser.read_response", f"{type(parser).__name__}.read_response is not a coroutine function"
        )
        assert reply_reader(conn) == parser.read_response
        await conn.send_command("SCRIPT", "FLUSH", check_health=False)
        assert await conn.read_response() == b"OK"
        # NOSCRIPT, the same command as EVAL, then PING: one reply each, in order, on one write.
        await conn.send_packed_command([check, as_eval(check), b"*1\r\n$4\r\nPING\r\n"], check_health=False)
        read = reply_reader(conn)
        missing, reply, pong = await _read(read), await _read(read), await _read(read)
        assert isinstance(missing, NoScriptError), broken(
            "_parser.read_response", f"NOSCRIPT read as {missing!r}, not a NoScriptError"
        )
        decision = decision_at(reply, 0, limit)
        assert decision.allowed and decision.remaining == 2, broken("_parser.read_response", f"script reply {reply!r}")
        assert pong == b"PONG", broken("_parser.read_response", f"replies out of step after an error: {pong!r}")
    finally:
        await conn.disconnect()
        await store.close()


async def test_connect_opens_the_socket_to_host_and_connection_arguments(redis_standalone: RedisStandalone) -> None:
    assert inspect.iscoroutinefunction(getattr(aioredis.Connection, "_connect", None)), broken(
        "Connection._connect", "missing or not a coroutine function"
    )
    assert callable(getattr(aioredis.Connection, "_connection_arguments", None)), broken(
        "Connection._connection_arguments", "missing"
    )
    # _connect reads self.host when it runs (our override sets it to each resolved address).
    conn = aioredis.Connection(host="host.invalid", port=redis_standalone.port, socket_connect_timeout=2)
    conn.host = HOST
    try:
        await conn.connect()
    except (OSError, redis.exceptions.ConnectionError) as exc:
        pytest.fail(broken("Connection._connect", f"did not connect to self.host as set before connect: {exc}"))
    finally:
        await conn.disconnect()
    arguments = aioredis.Connection(host=HOST, port=redis_standalone.port)._connection_arguments()
    assert (arguments.get("host"), arguments.get("port")) == (HOST, redis_standalone.port), broken(
        "Connection._connection_arguments", f"gave {dict(arguments)!r}"
    )
    tls = aioredis.SSLConnection(host=HOST, port=redis_standalone.port, ssl_cert_reqs="none")._connection_arguments()
    assert isinstance(tls.get("ssl"), ssl.SSLContext), broken(
        "Connection._connection_arguments", f"an SSLConnection's has no 'ssl' context: {dict(tls)!r}"
    )


async def test_our_resolving_connections_use_both(redis_standalone: RedisStandalone) -> None:
    """Through ``_connect`` and ``_connection_arguments``: a host name is resolved by us, the
    host attribute restored, and a TLS connection names the host for its certificate."""
    conn = ResolvingConnection(host="localhost", port=redis_standalone.port, socket_connect_timeout=2)
    try:
        await conn.connect()
        await conn.send_command("PING", check_health=False)
        assert await conn.read_response() == b"PONG"
        assert conn.host == "localhost", broken("Connection._connect", f"left host as {conn.host!r}")
    finally:
        await conn.disconnect()
    tls = ResolvingSSLConnection(host="localhost", port=redis_standalone.port, ssl_cert_reqs="none")
    tls._server_hostname = "localhost"
    arguments = tls._connection_arguments()
    assert arguments.get("server_hostname") == "localhost" and arguments.get("ssl") is not None, broken(
        "Connection._connection_arguments", f"gave {dict(arguments)!r}"
    )


def test_public_connection_calls_keep_their_parameters() -> None:
    """The keyword arguments ``connections.py`` passes (public API, but its signature can move)."""
    for method, parameter in [
        ("send_packed_command", "check_health"), ("send_command", None), ("disconnect", "nowait"),
    ]:
        function = getattr(aioredis.Connection, method, None)
        assert function is not None, broken(f"Connection.{method}", "missing")
        if parameter is not None:
            assert parameter in inspect.signature(function).parameters, broken(
                f"Connection.{method}", f"has no {parameter} parameter"
            )
    assert isinstance(inspect.getattr_static(aioredis.Connection, "is_connected", None), property), broken(
        "Connection.is_connected", "is not a property"
    )


async def test_arrivals_count_what_the_connection_receives(redis_standalone: RedisStandalone) -> None:
    """``arrivals`` wraps the feed of ``"Connection._reader"`` (an ``asyncio.StreamReader``) and
    finds the socket through ``"Connection._writer"``'s transport."""
    store = RedisStore(redis_standalone.url, timeout=5, connect_timeout=2)
    conn = new_connection(store.client)
    try:
        await conn.connect()
        assert isinstance(getattr(conn, "_reader", None), asyncio.StreamReader), broken(
            "Connection._reader", "is not the connection's asyncio.StreamReader"
        )
        assert isinstance(getattr(conn, "_writer", None), asyncio.StreamWriter), broken(
            "Connection._writer", "is not the connection's asyncio.StreamWriter"
        )
        counted = arrivals(conn)
        assert counted is not None and counted.fd == conn._writer.transport.get_extra_info("socket").fileno()
        assert arrivals(conn) is counted  # one count per reader
        before = counted.chunks
        await conn.send_packed_command([b"*1\r\n$4\r\nPING\r\n"], check_health=False)
        await asyncio.sleep(0.05)  # the reply is read into the reader (our loop was idle)
        assert counted.chunks > before, broken("Connection._reader", "its protocol no longer feeds it (feed_data)")
        assert not counted.waiting()  # nothing left in the kernel
        assert await _read(reply_reader(conn)) in (b"PONG", "PONG")
    finally:
        await conn.disconnect()
        await store.close()


def test_every_reliance_is_checked() -> None:
    """A reliance added to ``RELIED_ON`` needs a check above (named in this module's source)."""
    source = inspect.getsource(inspect.getmodule(test_every_reliance_is_checked))  # type: ignore[arg-type]
    unchecked = [name for name in RELIED_ON if f'"{name}"' not in source]
    assert not unchecked, f"redis-py {VERSION}: no check here for {unchecked}"
