"""Real Redis / Sentinel / Cluster / Memcached servers for tests, on free loopback ports.

Each server is a child process with its own temporary directory; ``stop`` kills it and
``start`` brings it back on the same port (for failure tests).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratewarden.bench.services import free_cluster_port, free_port

HOST = "127.0.0.1"


def have(binary: str) -> bool:
    return shutil.which(binary) is not None


def _ask(port: int, payload: bytes, timeout: float = 0.5) -> bytes:
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(payload)
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def redis_cmd(port: int, *args: str) -> str:
    """One command through ``redis-cli`` (simple, and independent of the code under test); options
    such as ``-a PASSWORD`` may lead ``args``."""
    out = subprocess.run(
        ["redis-cli", "-h", HOST, "-p", str(port), *args], capture_output=True, text=True, timeout=10
    )
    return out.stdout.strip()


def wait_until(check, timeout: float, what: str, interval: float = 0.02) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(interval)


class Server:
    """One server process."""

    def __init__(self, argv: list[str], port: int, ready: bytes, probe: bytes) -> None:
        self.argv = argv
        self.port = port
        self._ready = ready
        self._probe = probe
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: self._answers(self.proc), timeout, f"{self.argv[0]}:{self.port}")
        if self.argv[0] == "redis-server":
            # The answer must come from this process: a free port taken meanwhile by another server
            # would pass the probe while ours exits on "address in use" (a Sentinel set-up then
            # waits forever for its missing member).
            auth = ["-a", self.argv[self.argv.index("--requirepass") + 1], "--no-auth-warning"] if "--requirepass" in self.argv else []
            pid = redis_cmd(self.port, *auth, "INFO", "server").partition("process_id:")[2].split()[0:1]
            if pid != [str(self.proc.pid)]:
                self.stop()
                raise RuntimeError(f"port {self.port} is answered by another process (pid {pid}), not ours")

    def _answers(self, proc: subprocess.Popen[bytes]) -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{self.argv[0]} on port {self.port} exited with {proc.returncode} at start")
        return _ask(self.port, self._probe).startswith(self._ready)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing until ``resume``. Returns once
        the kernel reports it stopped (a signal is delivered asynchronously: a multi-threaded
        server could still answer a request sent right after the kill)."""
        assert self.proc is not None
        pid = self.proc.pid
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("T"), 5, "the pause")

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def unread(self) -> int:
        """Bytes clients sent that this server has not read yet (its connections' receive queues,
        from ``/proc/net/tcp``): how a test knows a request reached a paused server."""
        port = f":{self.port:04X}"
        total = 0
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1].endswith(port) and fields[3] == "01":  # our side, ESTABLISHED
                total += int(fields[4].partition(":")[2], 16)
        return total

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP until the block ends; returns once the kernel reports the process stopped."""
        self.pause()
        try:
            yield
        finally:
            self.resume()


def redis_server(directory: Path, port: int | None = None, *extra: str) -> Server:
    port = port or free_port()
    argv = [
        "redis-server", "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
        "--dir", str(directory), "--protected-mode", "no", "--loglevel", "warning", *extra,
    ]
    return Server(argv, port, b"+PONG", b"PING\r\n")


class RedisStandalone:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rw-redis-"))
        self.socket = str(self.dir / "redis.sock")  # the same server on a unix socket too
        self.server = redis_server(self.dir, None, "--unixsocket", self.socket, "--unixsocketperm", "700")
        self.port = self.server.port
        self.url = f"redis://{HOST}:{self.port}/0"

    def start(self) -> RedisStandalone:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def valkey_binary() -> str:
    """Where ``scripts/install-valkey.sh`` puts the Valkey server (``RATEWARDEN_VALKEY_SERVER`` overrides)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return os.environ.get("RATEWARDEN_VALKEY_SERVER") or str(cache / "ratewarden" / "valkey-9.1.2" / "valkey-server")


class ValkeyStandalone:
    """One Valkey server (9.1.2), spoken to as ``valkey://``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rw-valkey-"))
        self.port = free_port()
        argv = [valkey_binary(), "--port", str(self.port), "--bind", HOST, "--save", "", "--appendonly", "no",
                "--dir", str(self.dir), "--protected-mode", "no", "--loglevel", "warning"]
        self.server = Server(argv, self.port, b"+PONG", b"PING\r\n")
        self.url = f"valkey://{HOST}:{self.port}/0"

    def start(self) -> ValkeyStandalone:
        self.server.start()
        info = redis_cmd(self.port, "INFO", "server")
        if "valkey_version:" not in info:
            self.close()
            raise RuntimeError(f"port {self.port} is not answered by our Valkey: {info[:200]!r}")
        return self

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisCluster:
    """Three primaries with one replica each, joined by ``redis-cli --cluster create``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rw-cluster-"))
        self.servers: list[Server] = []
        while len(self.servers) < 6:
            port = free_cluster_port()
            if port in (s.port for s in self.servers):  # a port just closed can be handed out again
                continue
            node_dir = self.dir / str(port)
            node_dir.mkdir()
            self.servers.append(
                redis_server(
                    node_dir, port, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "1000",
                )
            )
        self.ports = [s.port for s in self.servers]
        self.url = f"redis+cluster://{HOST}:{self.ports[0]}"

    def start(self) -> RedisCluster:
        for s in self.servers:
            s.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"{HOST}:{p}" for p in self.ports),
             "--cluster-replicas", "1", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )
        for port in self.ports:
            wait_until(
                lambda p=port: "cluster_state:ok" in redis_cmd(p, "CLUSTER", "INFO"), 60, f"cluster node {port}", 0.1
            )
        # Every node must know every slot owner before clients connect.
        wait_until(
            lambda: all(redis_cmd(p, "CLUSTER", "SLOTS").count("\n") > 10 for p in self.ports), 60, "slot map", 0.1
        )
        return self

    def primaries(self) -> list[int]:
        out = redis_cmd(self.ports[0], "CLUSTER", "NODES")
        return [int(line.split()[1].split("@")[0].split(":")[1]) for line in out.splitlines() if "master" in line]

    def close(self) -> None:
        for s in self.servers:
            s.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisSentinel:
    """A primary, one replica and three Sentinels (quorum 2) watching service ``mymaster``."""

    service = "mymaster"

    def __init__(self, down_after_ms: int = 400) -> None:
        self.down_after_ms = down_after_ms
        self._build()

    def _build(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rw-sentinel-"))
        (self.dir / "p").mkdir()
        (self.dir / "r").mkdir()
        self.primary = redis_server(self.dir / "p")
        self.replica = redis_server(self.dir / "r", None, "--replicaof", HOST, "0")
        self.sentinels: list[Server] = []
        for i in range(3):
            port = free_port()
            sdir = self.dir / f"s{i}"
            sdir.mkdir()
            conf = sdir / "sentinel.conf"
            self.sentinels.append(
                Server(["redis-server", str(conf), "--sentinel"], port, b"+PONG", b"PING\r\n")
            )
        self.url = f"redis+sentinel://{','.join(f'{HOST}:{s.port}' for s in self.sentinels)}/{self.service}"

    def start(self, attempts: int = 3) -> RedisSentinel:
        """Starts the set-up; one that does not come together (a port taken between its choice and
        its use, or discovery stalled on a loaded machine) is torn down and built again on fresh
        ports, up to ``attempts`` times, and the last failure says what each Sentinel saw."""
        for attempt in range(attempts):
            try:
                return self._start()
            except RuntimeError as exc:
                seen = "; ".join(self._view(s.port) for s in self.sentinels)
                self.close()
                if attempt == attempts - 1:
                    raise RuntimeError(f"{exc} (after {attempts} attempts; sentinels saw: {seen})") from exc
                self._build()
        raise AssertionError("unreachable")

    def _view(self, port: int) -> str:
        try:
            fields = redis_cmd(port, "SENTINEL", "MASTER", self.service).split("\n")
        except (OSError, subprocess.SubprocessError):
            return f"{port}: no answer"
        pairs = dict(zip(fields[::2], fields[1::2], strict=False))
        wanted = ("flags", "num-slaves", "num-other-sentinels", "port")
        return f"{port}: " + ",".join(f"{k}={pairs.get(k)}" for k in wanted)

    def _start(self) -> RedisSentinel:
        self.replica.argv[self.replica.argv.index("--replicaof") + 2] = str(self.primary.port)
        self.primary.start()
        self.replica.start()
        for i, s in enumerate(self.sentinels):
            conf = self.dir / f"s{i}" / "sentinel.conf"
            conf.write_text(
                f"port {s.port}\nbind {HOST}\ndir {conf.parent}\nprotected-mode no\n"
                f"sentinel monitor {self.service} {HOST} {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} 2000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
            s.start()
        wait_until(lambda: "master_link_status:up" in redis_cmd(self.replica.port, "INFO", "replication"), 20,
                   "replica sync", 0.05)
        for s in self.sentinels:
            wait_until(
                lambda s=s: "num-other-sentinels\n2" in redis_cmd(s.port, "SENTINEL", "MASTER", self.service)
                and "num-slaves\n1" in redis_cmd(s.port, "SENTINEL", "MASTER", self.service),
                30, "sentinels to discover each other", 0.1,
            )
        return self

    def master_port(self) -> int:
        out = redis_cmd(self.sentinels[0].port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(out.split()[1])

    def close(self) -> None:
        for s in [*self.sentinels, self.primary, self.replica]:
            s.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class Memcached:
    def __init__(self) -> None:
        self.port = free_port()
        argv = ["memcached", "-l", HOST, "-p", str(self.port), "-U", "0", "-m", "64", "-t", "2"]
        if os.geteuid() == 0:
            argv += ["-u", "root"]
        self.server = Server(argv, self.port, b"VERSION", b"version\r\n")
        self.url = f"memcached://{HOST}:{self.port}"

    def start(self) -> Memcached:
        self.server.start()
        return self

    def close(self) -> None:
        self.server.stop()


@contextlib.contextmanager
def uvicorn_in_thread(app: object, **config: object) -> Iterator[int]:
    """``app`` served by uvicorn on a free loopback port in a daemon thread (lifespan off unless
    ``config`` says otherwise); yields the port, stops the server at the end."""
    import threading

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, 0))
    config.setdefault("log_level", "warning")
    config.setdefault("lifespan", "off")
    server = uvicorn.Server(uvicorn.Config(app, **config))  # type: ignore[arg-type]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@contextlib.contextmanager
def gunicorn_server(
    app: str, *, workers: int = 1, threads: int = 1, worker_class: str = "sync",
    env: dict[str, str] | None = None, preload: bool = False, timeout: float = 20.0,
) -> Iterator[int]:
    """``gunicorn APP`` (``module:attr``, importable from the repository root) on a free loopback
    port, as its own process; yields the port once it answers, stops it (SIGTERM, then SIGKILL)."""
    import sys

    port = free_port()
    argv = [
        sys.executable, "-m", "gunicorn", app, "--bind", f"{HOST}:{port}", "--workers", str(workers),
        "--threads", str(threads), "--worker-class", worker_class, "--log-level", "warning",
        "--graceful-timeout", "2", "--backlog", "2048",
    ]
    if preload:
        argv.append("--preload")
    root = Path(__file__).resolve().parents[1]
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), child_env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(argv, cwd=root, env=child_env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"gunicorn {app} exited with {proc.returncode}"
            try:
                with socket.create_connection((HOST, port), timeout=0.5):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"gunicorn {app} did not listen on {port}"
                time.sleep(0.05)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def http_burst(port: int, path: str, total: int, concurrency: int = 150,
               headers: dict[str, str] | None = None) -> list[int]:
    """``total`` GETs of ``path`` over loopback, ``concurrency`` at a time (one connection each):
    their status codes, in no particular order."""
    import http.client
    from concurrent.futures import ThreadPoolExecutor

    def one(_: int) -> int:
        for attempt in range(3):
            conn = http.client.HTTPConnection(HOST, port, timeout=30)
            try:
                conn.request("GET", path, headers=headers or {})
                response = conn.getresponse()
                response.read()
                return response.status
            except (ConnectionError, http.client.RemoteDisconnected):
                if attempt == 2:
                    raise
                time.sleep(0.05)  # refused before the request was read: never counted
            finally:
                conn.close()
        raise AssertionError("unreachable")

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, range(total)))


#: The gunicorn rows of the WSGI exactness tests, (workers, threads, worker class): one sync worker,
#: one gthread worker of 8 threads, four sync workers.
GUNICORN_ROWS = (
    pytest.param((1, 1, "sync"), id="1-sync"),
    pytest.param((1, 8, "gthread"), id="gthread-8"),
    pytest.param((4, 1, "sync"), id="4-sync"),
)


def wait_for_workers(port: int, workers: int, pids: Path, timeout: float = 15.0) -> None:
    """Unlimited requests until each of the ``workers`` has answered one (a worker still importing
    the app cannot take part in the burst), then forget who answered them."""
    deadline = time.monotonic() + timeout
    while len(list(pids.iterdir())) < workers:
        assert time.monotonic() < deadline, f"{len(list(pids.iterdir()))} of {workers} workers answered"
        http_burst(port, "/warm-up", 4 * workers, concurrency=4 * workers)
    for pid in pids.iterdir():
        pid.unlink()


def gunicorn_exactly_100(app: str, path: str, server: tuple[int, int, str], env: dict[str, str], tmp_path: Path) -> None:
    """``app`` under gunicorn as ``server`` says, with ``env``: 150 concurrent requests of ``path``
    against a limit of 100 admit exactly 100 (and, with several workers, more than one answered)."""
    workers, threads, worker_class = server
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {"RW_LIMIT": "100", "RW_PIDS": str(pids), **env}
    if workers > 1:
        env.setdefault("RW_SLEEP", "0.005")  # an admitted request takes a while: every worker gets some
    with gunicorn_server(app, workers=workers, threads=threads, worker_class=worker_class, env=env) as port:
        if workers > 1:
            wait_for_workers(port, workers, pids)
        codes = http_burst(port, path, 150, concurrency=150)
    assert set(codes) <= {200, 429}, sorted(set(codes))
    assert codes.count(200) == 100, f"{codes.count(200)} admitted of 150 against 100"
    if workers > 1:
        assert len(list(pids.iterdir())) > 1, "one worker answered every request: nothing was shared"


_TWEMPROXY_POOL = """{name}:
  listen: {listen}
  redis: true
  hash: fnv1a_64
  distribution: ketama
  hash_tag: "{{}}"
  auto_eject_hosts: false
  servers:
    - {host}:{redis}:1
"""


class Twemproxy:
    """nutcracker in front of one Redis (``redis_port``), listening on TCP (``port``) and on a unix
    socket (``socket``, in a directory whose name says nutcracker, as the reference's default path)."""

    def __init__(self, redis_port: int) -> None:
        self.binary = shutil.which("nutcracker") or "/usr/sbin/nutcracker"
        self.dir = Path(tempfile.mkdtemp(prefix="rw-nutcracker-"))
        self.redis_port = redis_port
        self.port, self.socket = free_port(), str(self.dir / "ratelimit.sock")
        config = self.dir / "nutcracker.yml"
        config.write_text(_TWEMPROXY_POOL.format(name="tcp", listen=f"{HOST}:{self.port}", host=HOST, redis=redis_port)
                          + _TWEMPROXY_POOL.format(name="unix", listen=f"{self.socket} 0600", host=HOST, redis=redis_port))
        argv = [self.binary, "-c", str(config), "-s", str(free_port()), "-o", str(self.dir / "nutcracker.log")]
        self.server = Server(argv, self.port, b"+PONG", b"*1\r\n$4\r\nPING\r\n")  # it reads no inline commands

    def start(self) -> Twemproxy:
        try:
            self.server.start()
        except BaseException:
            self.server.stop()
            raise
        return self

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
