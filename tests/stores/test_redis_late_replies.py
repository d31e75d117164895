"""A script that ran in time but whose reply reached the synchronous client after it gave up (the
server descheduled between the two on a loaded machine, a slow network) changed the count all
the same. The check failed, so the limiter decided it without the store: the insurance limiter
admitted it and charged it back to the store, or fail-closed answered 503. Either way that
request counts once at most: the client reads the late reply when it comes, and a charge the
script made is given back (``Ledger.credit``), so the insurance limiter's charge-back does not
count it twice (before: 9 of 10 admitted, as ``tests/django/test_servers.py`` saw with 92 of 100
on a busy machine) and a refused request is not charged. The same holds for a charge-back
(``adjust``) that was applied while its caller gave up and is owed again.

The delay is injected by a proxy that holds a script call's reply back until the test releases
it: the script runs at once, its reply reaches the client after the client gave up."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from ratewarden.decision import Decision
from ratewarden.enforcement.sync_check import store_answer_blocking
from ratewarden.errors import LimitUnavailable
from ratewarden.limiter import Limiter
from ratewarden.limits import make_limits
from ratewarden.stores.redis import RedisStore
from tests.servers import HOST, RedisStandalone

TIMEOUT = 0.5  # a round trip through the proxy never takes that long, even on a busy machine


class _Connection:
    """One client connection through the proxy: its script calls sent while the proxy held, whose
    replies wait for ``gate``."""

    def __init__(self) -> None:
        self.held: list[threading.Event] = []
        self.lock = threading.Lock()


class HoldingProxy:
    """A TCP proxy in front of a server. A script call (``EVALSHA``, ``EVAL``) sent while
    ``holding`` runs at once, but its reply waits until ``release()``; ``late`` counts the replies
    so delivered. The client gives up on a held reply after its timeout, whatever the machine's
    load: nothing reaches it before it is released."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.holding = False
        self.gate = threading.Event()
        self.late = 0
        self.changed = threading.Condition()
        self.listener = socket.create_server((HOST, 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection((HOST, self.upstream))
            self.sockets += [client, server]
            connection = _Connection()
            threading.Thread(target=self._requests, args=(client, server, connection), daemon=True).start()
            threading.Thread(target=self._replies, args=(server, client, connection), daemon=True).start()

    def _requests(self, source: socket.socket, sink: socket.socket, connection: _Connection) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if self.holding and b"EVAL" in data[:32]:
                    with connection.lock:  # before the call goes on: its reply cannot come first
                        connection.held.append(self.gate)
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def _replies(self, source: socket.socket, sink: socket.socket, connection: _Connection) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with connection.lock:
                    gate = connection.held.pop(0) if connection.held else None
                if gate is not None:
                    gate.wait(30)
                sink.sendall(data)
                if gate is not None:
                    with self.changed:
                        self.late += 1
                        self.changed.notify_all()
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def hold(self) -> None:
        """Hold the replies of the script calls sent from now on."""
        self.gate = threading.Event()
        self.holding = True

    def release(self) -> None:
        """Stop holding; the held replies go, in order."""
        self.holding = False
        self.gate.set()

    def wait_late(self, count: int) -> None:
        """Until ``count`` held replies have reached the client's socket."""
        with self.changed:
            assert self.changed.wait_for(lambda: self.late >= count, 10), f"{self.late} of {count} late replies delivered"

    def close(self) -> None:
        self.release()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def proxy(redis_standalone: RedisStandalone) -> Iterator[HoldingProxy]:
    proxy = HoldingProxy(redis_standalone.port)
    try:
        yield proxy
    finally:
        proxy.close()


def _limiter(proxy: HoldingProxy, on_error: str) -> Limiter:
    store = RedisStore(f"redis://{HOST}:{proxy.port}/0?timeout={TIMEOUT}")
    return Limiter(store, on_error=on_error, workers=1)  # type: ignore[arg-type]


def _late_check(proxy: HoldingProxy, check: Callable[[], Decision | None]) -> Decision | None:
    """``check()`` with its reply held: its script runs at once, its reply reaches the client
    after the client gave up (``TIMEOUT``). Returns once that reply has reached the client."""
    late = proxy.late
    proxy.hold()
    try:
        return check()
    finally:
        proxy.release()
        proxy.wait_late(late + 1)


@pytest.mark.parametrize("on_error", ["open", "closed"])
def test_a_late_reply_to_a_failed_check_counts_the_request_once(proxy: HoldingProxy, on_error: str) -> None:
    limiter = _limiter(proxy, on_error)
    store = limiter.store
    (limit,) = make_limits("10/hour")
    key = f"rw:{{late|{uuid.uuid4().hex}}}:{limit.suffix}"

    def check() -> Decision | None:
        return store_answer_blocking(limiter, [key], [limit], [1.0], "store")

    try:
        for _ in range(3):
            decision = check()
            assert decision is not None and decision.allowed
        admitted = 3
        if on_error == "open":
            decision = _late_check(proxy, check)
            assert decision is not None and decision.allowed  # the insurance limiter admitted it
            assert limiter.without_store()["local_limiter"] == 1
            admitted += 1
        else:
            with pytest.raises(LimitUnavailable):
                _late_check(proxy, check)
        answered = [check() for _ in range(10)]
        admitted += sum(1 for d in answered if d is not None and d.allowed)
        assert admitted == 10, f"{admitted} admitted against a limit of 10"
        (peeked,) = store.peek_blocking([key], [limit])
        assert peeked.remaining == 0
    finally:
        asyncio.run(store.close())


def test_a_charge_back_applied_after_its_caller_gave_up_is_not_applied_twice(proxy: HoldingProxy) -> None:
    """The insurance limiter admitted a check; the next check's charge-back (``adjust``) reaches
    the server in time, its reply comes late: it is owed again (that check fails with its error
    and is admitted by the insurance limiter too) and given back when the late reply says it was
    applied, so each admitted request is charged once."""
    limiter = _limiter(proxy, "open")
    store = limiter.store
    (limit,) = make_limits("10/hour")
    key = f"rw:{{late|{uuid.uuid4().hex}}}:{limit.suffix}"

    def check() -> Decision | None:
        return store_answer_blocking(limiter, [key], [limit], [1.0], "store")

    try:
        decision = check()
        assert decision is not None and decision.allowed
        proxy.hold()
        decision = check()  # its script runs, its reply is held: admitted by the insurance limiter
        assert decision is not None and decision.allowed
        assert limiter.store.ledger.owed  # type: ignore[attr-defined]
        decision = check()  # its charge-back runs, its reply is held: owed again; admitted as well
        assert decision is not None and decision.allowed
        assert limiter.without_store()["local_limiter"] == 2
        proxy.release()
        proxy.wait_late(2)
        admitted = 3
        answered = [check() for _ in range(10)]
        admitted += sum(1 for d in answered if d is not None and d.allowed)
        assert admitted == 10, f"{admitted} admitted against a limit of 10"
        (peeked,) = store.peek_blocking([key], [limit])
        assert peeked.remaining == 0
    finally:
        asyncio.run(store.close())


def test_the_insurance_limiter_starts_each_failure_from_the_latest_answer(proxy: HoldingProxy) -> None:
    """Failures now and then while the store answers (a busy machine's stalls): a key's insurance
    count, seeded at its first failure, is brought down to what the store said last at each later
    one, so checks failed once the limit is reached are refused (before: seeded once per outage
    window, the insurance limiter went on admitting from what was left at the first failure)."""
    limiter = _limiter(proxy, "open")
    store = limiter.store
    (limit,) = make_limits("20/hour")
    key = f"rw:{{late|{uuid.uuid4().hex}}}:{limit.suffix}"

    def check() -> Decision | None:
        return store_answer_blocking(limiter, [key], [limit], [1.0], "store")

    def admitted(decisions: list[Decision | None]) -> int:
        assert all(d is not None for d in decisions)
        return sum(1 for d in decisions if d is not None and d.allowed)

    try:
        assert admitted([check(), check()]) == 2
        assert admitted([_late_check(proxy, check)]) == 1  # the insurance limiter, seeded with 18 left
        assert admitted([check() for _ in range(16)]) == 16  # the store says 1 is left
        assert admitted([_late_check(proxy, check)]) == 1  # the 20th: the last one
        assert admitted([_late_check(proxy, check) for _ in range(3)]) == 0
        assert admitted([check() for _ in range(3)]) == 0
        (peeked,) = store.peek_blocking([key], [limit])
        assert peeked.remaining == 0
        assert limiter.without_store()["local_limiter"] == 5
    finally:
        asyncio.run(store.close())
