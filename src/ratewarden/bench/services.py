"""The stores behind the limiters: connect (or start a private redis-server/memcached), flush, count commands."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from types import TracebackType

from .adapters.base import StoreSpec

__all__ = ["BenchError", "StoreService"]

_OWN_COMMANDS = {"info", "flushdb", "flushall", "ping", "config", "hello", "client", "command"}
_MEMCACHED_COUNTERS = ("cmd_get", "cmd_set", "cmd_touch", "incr_hits", "incr_misses", "decr_hits", "decr_misses",
                       "delete_hits", "delete_misses", "cas_hits", "cas_misses", "cas_badval")


class BenchError(Exception):
    """A user-fixable problem (bad flag, unreachable store, missing tool): printed without a traceback."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StoreService:
    """One store for the whole run. With no URL, starts a throwaway server on a free loopback port."""

    def __init__(self, kind: str, url: str = "") -> None:
        self.kind, self.url = kind, url
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> StoreService:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    @property
    def spec(self) -> StoreSpec:
        return StoreSpec(self.kind, self.url)

    def start(self) -> None:
        if self.kind == "memory":
            return
        if not self.url:
            self._spawn()
        deadline = time.monotonic() + (10 if self.proc else 2)
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                self.flush()
                return
            except Exception as exc:
                last = exc
                time.sleep(0.1)
        self.stop()
        raise BenchError(f"the {self.kind} store at {self.url} does not answer ({last}); start it or pass "
                         f"another --{self.kind}-url")

    def _spawn(self) -> None:
        port = _free_port()
        if self.kind == "redis":
            exe = shutil.which("redis-server")
            cmd = [exe or "", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            self.url = f"redis://127.0.0.1:{port}/0"
        else:
            exe = shutil.which("memcached")
            cmd = [exe or "", "-p", str(port), "-l", "127.0.0.1", "-U", "0", "-m", "256"]
            if os.geteuid() == 0:
                cmd += ["-u", "root"]  # memcached refuses to run as root otherwise
            self.url = f"memcached://127.0.0.1:{port}"
        if exe is None:
            raise BenchError(f"no --{self.kind}-url given and {cmd[0] or self.kind} is not installed "
                             f"(apt-get install {'redis-server' if self.kind == 'redis' else 'memcached'})")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)

    def flush(self) -> None:
        """Drop every key so each iteration starts from a clean store."""
        if self.kind == "redis":
            import redis

            with redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2) as r:
                r.flushdb()
        elif self.kind == "memcached":
            from pymemcache.client.base import Client  # type: ignore[import-untyped, unused-ignore]

            client = Client(self.spec.host_port, connect_timeout=2, timeout=2)
            try:
                client.flush_all(noreply=False)
            finally:
                client.close()

    def commands(self) -> int | None:
        """Commands the store has served so far (not counting the harness's own), or None for memory."""
        if self.kind == "redis":
            import redis

            with redis.Redis.from_url(self.url, socket_timeout=2) as r:
                stats = r.info("commandstats")
            return sum(int(v["calls"]) for k, v in stats.items()
                       if k.removeprefix("cmdstat_").split("|")[0] not in _OWN_COMMANDS)
        if self.kind == "memcached":
            from pymemcache.client.base import Client  # type: ignore[import-untyped, unused-ignore]

            client = Client(self.spec.host_port, connect_timeout=2, timeout=2)
            try:
                raw = client.stats()
            finally:
                client.close()
            return sum(int(raw.get(k.encode(), raw.get(k, 0))) for k in _MEMCACHED_COUNTERS)
        return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
