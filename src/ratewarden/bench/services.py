"""The stores behind the limiters: connect (or start private servers), flush, count commands.

With no URL the harness starts its own throwaway server on free loopback ports: one ``redis-server``,
one ``memcached``, or, for ``redis-cluster``, six ``redis-server`` nodes (3 primaries, 3 replicas)
joined with ``redis-cli --cluster create --cluster-replicas 1``, as ratelimit_bench does.
``shm`` (one host's shared memory: ratewarden's ``SharedMemoryStore``, traffik's multiprocess backend)
gets a fresh table name and a private directory per run, both removed when the run ends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from types import TracebackType

from ..errors import RatewardenError
from .adapters.base import StoreSpec

__all__ = ["REDIS_SERVER", "STORES", "BenchError", "StoreService", "free_cluster_port", "free_port", "redis_server"]

STORES = ("memory", "shm", "redis", "redis-cluster", "memcached")
HOST = "127.0.0.1"
_OWN_COMMANDS = {"info", "flushdb", "flushall", "ping", "config", "hello", "client", "command", "cluster",
                 "readonly"}
_MEMCACHED_COUNTERS = ("cmd_get", "cmd_set", "cmd_touch", "incr_hits", "incr_misses", "decr_hits", "decr_misses",
                       "delete_hits", "delete_misses", "cas_hits", "cas_misses", "cas_badval")
_INSTALL = {"redis": "redis-server", "redis-cluster": "redis-server redis-tools", "memcached": "memcached"}
#: The environment variable naming the server the bench starts for its private Redis (``--redis-server``).
REDIS_SERVER = "RATEWARDEN_BENCH_REDIS_SERVER"


class BenchError(RatewardenError):
    """A user-fixable problem (bad flag, unreachable store, missing tool): printed without a traceback."""


def redis_server() -> str:
    """The Redis-protocol server the bench starts for its private Redis: ``redis-server``, or what
    ``--redis-server`` named (``valkey-server``, or a path to one)."""
    return os.environ.get(REDIS_SERVER) or "redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is valid and free too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port + 10000))
            except OSError:
                continue
        return port


def _host_port(url: str, default: int) -> tuple[str, int]:
    rest = url.split("://", 1)[-1].split("/", 1)[0].split("?", 1)[0].split(",", 1)[0].rsplit("@", 1)[-1]
    host, _, port = rest.rpartition(":")
    return host or HOST, int(port or default)


def _redis_argv(exe: str, port: int, *extra: str) -> list[str]:
    return [exe, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no", "--protected-mode", "no",
            "--loglevel", "warning", *extra]


class StoreService:
    """One store for the whole run. With no URL, starts throwaway servers on free loopback ports."""

    def __init__(self, kind: str, url: str = "") -> None:
        self.kind, self.url = kind, url
        self.procs: list[subprocess.Popen[bytes]] = []
        self._dir: str | None = None
        self._primaries: list[tuple[str, int]] = []

    def __enter__(self) -> StoreService:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    @property
    def spec(self) -> StoreSpec:
        return StoreSpec(self.kind, self.url)

    @property
    def primaries(self) -> list[tuple[str, int]]:
        """The cluster's primaries (host, port); the one server for standalone Redis."""
        return list(self._primaries)

    def start(self) -> None:
        if self.kind == "memory":
            return
        if self.kind == "shm":
            self._start_shm()
            return
        if self.kind not in STORES:
            raise BenchError(f"unknown store {self.kind!r}; choose from {', '.join(STORES)}")
        last: Exception | None = None
        try:
            if not self.url:
                if self.kind == "redis-cluster":
                    self._spawn_cluster()
                else:
                    self._spawn()
            deadline = time.monotonic() + (10 if self.procs else 2)
            while time.monotonic() < deadline:
                try:
                    self._discover()
                    self.flush()
                    return
                except Exception as exc:
                    last = exc
                    time.sleep(0.1)
        except BenchError:
            self.stop()
            raise
        self.stop()
        raise BenchError(f"the {self.kind} store at {self.url} does not answer ({last}); start it or pass "
                         f"another --{self.kind}-url")

    def _start_shm(self) -> None:
        """A fresh table name (also traffik's POSIX segment name: 30 characters at most) in a private
        directory on tmpfs, so whatever the workers leave behind goes with the directory."""
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self._dir = tempfile.mkdtemp(prefix="ratewarden-bench-", dir=base)
        self.url = f"shm://rwbench-{uuid.uuid4().hex[:12]}?directory={self._dir}"

    def _exe(self, name: str) -> str:
        exe = shutil.which(name)
        if exe is None:
            how = "--redis-server names it" if os.environ.get(REDIS_SERVER) == name else f"apt-get install {_INSTALL[self.kind]}"
            raise BenchError(f"no --{self.kind}-url given and {name} is not installed ({how})")
        return exe

    def _popen(self, argv: list[str]) -> None:
        self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True))

    def _spawn(self) -> None:
        port = free_port()
        if self.kind == "redis":
            self._popen(_redis_argv(self._exe(redis_server()), port))
            self.url = f"redis://{HOST}:{port}/0"
            return
        cmd = [self._exe("memcached"), "-p", str(port), "-l", HOST, "-U", "0", "-m", "256"]
        if os.geteuid() == 0:
            cmd += ["-u", "root"]  # memcached refuses to run as root otherwise
        self._popen(cmd)
        self.url = f"memcached://{HOST}:{port}"

    def _spawn_cluster(self) -> None:
        """Six cluster-enabled nodes, joined as 3 primaries with one replica each."""
        import redis

        exe, cli = self._exe(redis_server()), self._exe("redis-cli")
        self._dir = tempfile.mkdtemp(prefix="rw-bench-cluster-")
        ports: list[int] = []
        for _ in range(6):
            port = free_cluster_port()
            node_dir = os.path.join(self._dir, str(port))
            os.mkdir(node_dir)
            self._popen(_redis_argv(exe, port, "--dir", node_dir, "--cluster-enabled", "yes",
                                    "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"))
            ports.append(port)
        def up(port: int) -> bool:
            with redis.Redis(HOST, port, socket_timeout=1) as r:
                return bool(r.ping())

        for port in ports:
            self._wait(functools.partial(up, port), f"node {port}")
        created = subprocess.run([cli, "--cluster", "create", *(f"{HOST}:{p}" for p in ports),
                                  "--cluster-replicas", "1", "--cluster-yes"],
                                 capture_output=True, text=True, timeout=60, check=False)
        if created.returncode != 0:
            raise BenchError(f"redis-cli --cluster create failed: {(created.stderr or created.stdout)[-300:]}")

        def ready(port: int) -> bool:
            with redis.Redis(HOST, port, socket_timeout=1, decode_responses=True) as r:
                info = str(r.execute_command("CLUSTER", "INFO"))
                slots = r.execute_command("CLUSTER", "SLOTS")
                nodes = str(r.execute_command("CLUSTER", "NODES"))
            replicas = sum("slave" in line.split()[2] for line in nodes.splitlines() if len(line.split()) > 2)
            return "cluster_state:ok" in info and len(slots) == 3 and replicas == 3

        for port in ports:
            self._wait(functools.partial(ready, port), f"cluster node {port} to see 3 primaries and 3 replicas")
        self.url = f"redis+cluster://{HOST}:{ports[0]}"

    def _wait(self, check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except Exception:  # not up yet
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"timed out waiting for {what}")
            time.sleep(0.1)

    def _discover(self) -> None:
        """Find the primaries to flush and count on (all of them, for a cluster)."""
        if self.kind == "redis":
            self._primaries = [_host_port(self.url, 6379)]
        elif self.kind == "redis-cluster":
            import redis

            host, port = _host_port(self.url, 6379)
            with redis.Redis(host, port, socket_timeout=2, socket_connect_timeout=2, decode_responses=True) as r:
                nodes = str(r.execute_command("CLUSTER", "NODES"))
            found = []
            for line in nodes.splitlines():
                fields = line.split()
                if len(fields) > 2 and "master" in fields[2].split(",") and "fail" not in fields[2]:
                    addr = fields[1].split("@", 1)[0]
                    h, _, p = addr.rpartition(":")
                    found.append((h or host, int(p)))
            if not found:
                raise BenchError(f"{self.url} lists no cluster primaries (is it a Redis Cluster?)")
            self._primaries = sorted(found)

    def flush(self) -> None:
        """Drop every key (on every primary) so each iteration starts from a clean store."""
        if self.kind in ("redis", "redis-cluster"):
            import redis

            for host, port in self._primaries or [_host_port(self.url, 6379)]:
                with redis.Redis(host, port, db=0, socket_timeout=2, socket_connect_timeout=2) as r:
                    r.flushdb()
        elif self.kind == "memcached":
            from pymemcache.client.base import Client  # type: ignore[import-untyped, unused-ignore]

            client = Client(self.spec.host_port, connect_timeout=2, timeout=2)
            try:
                client.flush_all(noreply=False)
            finally:
                client.close()

    def commands(self) -> int | None:
        """Commands the store has served so far (summed over primaries, not counting the harness's own)."""
        if self.kind in ("redis", "redis-cluster"):
            import redis

            total = 0
            for host, port in self._primaries:
                with redis.Redis(host, port, socket_timeout=2) as r:
                    stats = r.info("commandstats")
                total += sum(int(v["calls"]) for k, v in stats.items()
                             if k.removeprefix("cmdstat_").split("|")[0] not in _OWN_COMMANDS)
            return total
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
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []
        if self.kind == "shm" and self.url:
            # traffik's multiprocess backend names a POSIX segment after the table; a worker that
            # did not shut down cleanly leaves it in /dev/shm.
            name = self.url.split("://", 1)[1].split("?", 1)[0]
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
