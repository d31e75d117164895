"""Running ``ratewarden serve``: uvicorn for HTTP (and gRPC in the same event loop when Envoy
configurations are given), ``--workers N`` forked processes on one listening socket, hot reload
(``SIGHUP`` and file changes), graceful shutdown and structured logs.

The parent validates the configuration, binds the socket and forks the workers before anything
imports grpc, then only supervises: it forwards ``SIGHUP`` and ``SIGTERM``/``SIGINT``, restarts a
worker that died, and removes the shared-memory table it created when it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ..limiter import FailurePolicy, Limiter
from ..policy.loader import load_policy
from ..policy.reload import PolicyReloader
from ..policy.schema import Policy
from ..stores import open_store
from ..stores.urls import check_store_url
from . import bounds
from .http import DEFAULT_TRUSTED, ServeApp, parse_networks

__all__ = ["ServeConfig", "configure_logging", "envoy_files", "run"]

log = logging.getLogger("ratewarden.serve")
_YAML = (".yaml", ".yml")
#: Seconds a worker waits for in-flight requests (HTTP and gRPC) when asked to stop.
GRACE = 10
#: A worker that exits with status 1 this soon (seconds) after its start could not start: the service stops
#: (a worker that dies later, or of a signal, is replaced).
_CRASH_LOOP = 2.0


@dataclass
class ServeConfig:
    """What ``ratewarden serve`` runs (its command-line options)."""

    policy: Path | None = None
    envoy: list[Path] = field(default_factory=list)
    http: tuple[str, int] = ("127.0.0.1", 8080)
    grpc: tuple[str, int] | None = None
    spoe: tuple[str, int] | None = None
    workers: int = 1
    store: str | None = None
    trusted_proxies: Sequence[str] = DEFAULT_TRUSTED
    log_format: str = "json"
    log_level: str = "info"
    watch: float = 1.0
    on_error: FailurePolicy = "open"
    metrics: bool = True
    http_max_connections: int = bounds.HTTP_MAX_CONNECTIONS
    http_timeout: float = bounds.HTTP_TIMEOUT
    http_max_header_size: int = bounds.HTTP_MAX_HEADER_SIZE
    spoe_max_connections: int = bounds.SPOE_MAX_CONNECTIONS
    spoe_timeout_hello: float = bounds.SPOE_TIMEOUT_HELLO
    spoe_timeout_idle: float = bounds.SPOE_TIMEOUT_IDLE
    spoe_timeout_frame: float = bounds.SPOE_TIMEOUT_FRAME
    spoe_message: str = bounds.SPOE_MESSAGE
    grpc_max_message_size: int = bounds.GRPC_MAX_MESSAGE_SIZE
    max_descriptors: int = bounds.MAX_DESCRIPTORS
    max_entries: int = bounds.MAX_ENTRIES


# -- logs ------------------------------------------------------------------------------------------


class JSONFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``event``, ``logger``, ``pid``, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", "log"),
            "logger": record.name,
            "pid": record.process,
        }
        message = record.getMessage()
        if message != out["event"]:
            out["message"] = message
        out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``ts level [pid] event message key=value...``."""

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds")
        fields = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items())
        event = getattr(record, "event", "log")
        text = f"{ts} {record.levelname.lower()} [{record.process}] {event}: {record.getMessage()}"
        if fields:
            text += f" {fields}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure_logging(format: str = "json", level: str = "info") -> None:
    """Send the ``ratewarden`` and ``uvicorn`` logs to stderr in ``format`` (``json`` or ``text``).

    The service's events (``ratewarden.serve``) are logged from ``level``; the library's own lines
    (a refusal each, at INFO) only from WARNING unless ``level`` is ``debug``, so a flood of refusals
    does not become a flood of log lines.

    Args:
        format: ``"json"`` (one object per line) or ``"text"``.
        level: The least severe level logged (``debug``, ``info``, ``warning``, ``error``).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if format == "json" else TextFormatter())
    chosen = logging.getLevelName(level.upper())
    quiet = chosen if chosen <= logging.DEBUG else max(chosen, logging.WARNING)
    for name, least in (("ratewarden.serve", chosen), ("ratewarden", quiet), ("uvicorn", quiet), ("uvicorn.error", quiet)):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(least)
        logger.propagate = False


def _event(level: int, event: str, message: str = "", **fields: Any) -> None:
    log.log(level, message or event, extra={"event": event, "fields": fields})


# -- configuration files ---------------------------------------------------------------------------


def envoy_files(paths: Sequence[Path]) -> tuple[Path | None, list[Path]]:
    """Sort ``paths`` into the ratewarden policy file (at most one) and Envoy ratelimit YAML files
    (a directory is read for ``*.yaml``/``*.yml``; a YAML file with a top-level ``domain`` is Envoy's).

    Args:
        paths: The command line's files and directories.
    """
    policy: Path | None = None
    envoy: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in _YAML and p.is_file())
            if not found:
                raise ConfigurationError(f"{path}: no .yaml or .yml file in this directory")
            envoy.extend(found)
            continue
        if not path.is_file():
            raise ConfigurationError(f"{path}: no such file")
        if path.suffix.lower() in _YAML and _is_envoy(path):
            envoy.append(path)
            continue
        if policy is not None:
            raise ConfigurationError(f"{path}: only one ratewarden policy file is served (already {policy})")
        policy = path
    return policy, envoy


def _is_envoy(path: Path) -> bool:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, OSError, UnicodeDecodeError):
        return False  # the policy loader reports it, naming the line
    return isinstance(data, dict) and "domain" in data


def _load_envoy(paths: Sequence[Path]) -> Any:
    """The Envoy domains of ``paths`` (``serve.envoy_config``); raises on a broken file."""
    from .envoy_config import load_envoy_configs

    return load_envoy_configs(paths)


def _rate_limit_service(domains: Any, limiter: Limiter, config: ServeConfig) -> Any:
    rls: Any = importlib.import_module(f"{__package__}.rls")
    return rls.RateLimitService(domains, limiter, max_descriptors=config.max_descriptors, max_entries=config.max_entries)


# -- one worker ------------------------------------------------------------------------------------


def _uvicorn_server(app: ServeApp, sock: socket.socket, config: ServeConfig | None = None) -> Any:
    """A uvicorn server for ``app`` that leaves the signals to us, with ``config``'s HTTP bounds."""
    import uvicorn

    from .http_server import bounded_protocol

    class Server(uvicorn.Server):
        def install_signal_handlers(self) -> None:  # uvicorn < 0.29
            pass

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29
            yield

    bounded = config or ServeConfig()
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    protocol = bounded_protocol(
        http, max_connections=bounded.http_max_connections, timeout=bounded.http_timeout,
        max_header_size=bounded.http_max_header_size,
    )
    server_config = uvicorn.Config(
        # proxy_headers off: uvicorn would otherwise replace a loopback caller's address with its
        # X-Forwarded-For, and the check's own trusted-proxy rule would then see a stranger.
        app, lifespan="off", log_config=None, access_log=False, http=protocol, proxy_headers=False,
        timeout_graceful_shutdown=GRACE, server_header=False, date_header=False,
        timeout_keep_alive=bounds.HTTP_TIMEOUT_KEEP_ALIVE, h11_max_incomplete_event_size=bounded.http_max_header_size,
    )
    return Server(server_config)


def _metrics() -> Any:
    if importlib.util.find_spec("prometheus_client") is None:
        return None
    from ..metrics import Metrics

    return Metrics()


_MULTIPROCESS = "PROMETHEUS_MULTIPROC_DIR"


def _shared_metrics_directory() -> str | None:
    """For several workers: a directory where prometheus-client keeps every worker's counters (set
    in the environment before any worker imports it), so ``/metrics`` shows their totals."""
    if os.environ.get(_MULTIPROCESS) or importlib.util.find_spec("prometheus_client") is None:
        return None
    directory = tempfile.mkdtemp(prefix="ratewarden-serve-metrics-")
    os.environ[_MULTIPROCESS] = directory
    return directory


def _total_exposition(metrics: Any) -> Callable[[], bytes]:
    """``/metrics`` for workers: every worker's counters and histograms summed (prometheus-client's
    multiprocess mode), then this worker's own collectors (store caches, checks without the store)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    class Families:
        def __init__(self, families: list[Any]) -> None:
            self.families = families

        def collect(self) -> list[Any]:
            return self.families

    def exposition() -> bytes:
        shared = CollectorRegistry()
        MultiProcessCollector(shared)  # type: ignore[no-untyped-call, unused-ignore]
        families = list(shared.collect())
        summed = {family.name for family in families}
        families += [family for family in metrics.registry.collect() if family.name not in summed]
        return bytes(generate_latest(Families(families)))  # type: ignore[arg-type, unused-ignore]

    return exposition


class Worker:
    """One worker process: the app, its reloads and its servers."""

    def __init__(self, config: ServeConfig, store_url: str) -> None:
        self.config = config
        self.limiter = Limiter(open_store(store_url), on_error=config.on_error, workers=config.workers)
        self.metrics = _metrics() if config.metrics else None
        policy = load_policy(config.policy) if config.policy is not None else None
        self.rls = _rate_limit_service(_load_envoy(config.envoy), self.limiter, config) if config.envoy else None
        shared = self.metrics is not None and bool(os.environ.get(_MULTIPROCESS)) and config.workers > 1
        self.app = ServeApp(
            self.limiter, policy, trusted_proxies=config.trusted_proxies, metrics=self.metrics, rls=self.rls,
            exposition=_total_exposition(self.metrics) if shared else None,
        )
        self.reloader = PolicyReloader(config.policy, self._apply, interval=config.watch or 1.0) if config.policy else None
        self._envoy_signature = self._signature()

    def _apply(self, policy: Policy) -> None:
        self.app.apply_policy(policy)

    def _signature(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in self.config.envoy:
            try:
                st = path.stat()
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append((0, 0, 0))
        return tuple(out)

    def reload(self, reason: str) -> None:
        """Reload every file now (``SIGHUP``); a broken one keeps what is in force."""
        if self.reloader is not None:
            ok = self.reloader.reload()
            self._report(ok, "policy", self.config.policy, reason, self.reloader.last_error)
        if self.config.envoy:
            self._reload_envoy(reason)

    def poll(self) -> None:
        """Reload the files that changed."""
        if self.reloader is not None:
            changed = self.reloader.check()
            if changed is not None:
                self._report(changed, "policy", self.config.policy, "file changed", self.reloader.last_error)
        if self.config.envoy and self._signature() != self._envoy_signature:
            self._reload_envoy("file changed")

    def _reload_envoy(self, reason: str) -> None:
        self._envoy_signature = self._signature()
        try:
            domains = _load_envoy(self.config.envoy)
        except Exception as exc:
            self._report(False, "envoy", self.config.envoy, reason, exc)
            return
        if self.rls is not None:
            self.rls.replace(domains)
        self._report(True, "envoy", self.config.envoy, reason, None)

    @staticmethod
    def _report(ok: bool, kind: str, path: object, reason: str, error: BaseException | None) -> None:
        if ok:
            _event(logging.INFO, "reloaded", f"{kind} configuration reloaded", kind=kind, path=path, reason=reason)
        else:
            _event(
                logging.ERROR, "reload_rejected", f"{kind} reload rejected, keeping the previous configuration",
                kind=kind, path=path, reason=reason, error=str(error),
            )

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.config.watch)
            try:
                await asyncio.to_thread(self.poll)
            except Exception:
                log.exception("watching the configuration failed; will retry", extra={"event": "watch_failed"})

    async def serve(self, sock: socket.socket, parent: int | None = None, spoe: socket.socket | None = None) -> None:
        """Serve HTTP on ``sock`` (gRPC and HAProxy's SPOE on ``spoe`` when configured) until
        ``SIGTERM``/``SIGINT`` (or, for a forked worker, until its ``parent`` is gone)."""
        loop = asyncio.get_running_loop()
        server = _uvicorn_server(self.app, sock, self.config)
        grpc_server: Any = None
        spoe_server: asyncio.Server | None = None
        spoe_agent: Any = None
        stopping: list[asyncio.Task[Any]] = []

        def stop(reason: str) -> None:
            if server.should_exit:
                return
            _event(logging.INFO, "stopping", "stopping: finishing in-flight requests", reason=reason)
            server.should_exit = True
            if spoe_server is not None:  # no new SPOE connection; open ones end when HAProxy closes them
                spoe_server.close()
            if grpc_server is not None:  # both servers drain at once
                stopping.append(loop.create_task(grpc_server.stop(GRACE)))

        def hup() -> None:
            loop.run_in_executor(None, self.reload, "SIGHUP")

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop, signal.Signals(signum).name)
        loop.add_signal_handler(signal.SIGHUP, hup)
        if self.rls is not None and self.config.grpc is not None:
            grpc_module: Any = importlib.import_module(f"{__package__}.grpc")
            started = await grpc_module.start_grpc(
                self.rls, *self.config.grpc, reuse_port=self.config.workers > 1,
                max_message_size=self.config.grpc_max_message_size,
            )
            grpc_server = started[0] if isinstance(started, tuple) else started
        if spoe is not None:
            from .spoe import SpoeAgent, start_spoe

            spoe_agent = SpoeAgent(
                self.app, max_connections=self.config.spoe_max_connections, timeout_hello=self.config.spoe_timeout_hello,
                timeout_idle=self.config.spoe_timeout_idle, timeout_frame=self.config.spoe_timeout_frame,
                message=self.config.spoe_message,
            )
            spoe_server = await start_spoe(self.app, spoe, spoe_agent)
        tasks = [asyncio.create_task(self._watch())] if self.config.watch > 0 else []
        if parent is not None:
            tasks.append(asyncio.create_task(_orphaned(parent, stop)))
        await self.limiter.check_store()
        _event(logging.INFO, "worker_started", "worker serving", http="{}:{}".format(*sock.getsockname()[:2]))
        try:
            await server.serve(sockets=[sock])
        finally:
            for task in tasks:
                task.cancel()
            if spoe_server is not None:  # served through the HTTP drain; ended before the store closes
                spoe_server.close()
                await spoe_agent.close()
            if grpc_server is not None:
                await (stopping[0] if stopping else grpc_server.stop(GRACE))
            if self.metrics is not None:
                self.metrics.close()
            await self.limiter.close()
            _event(logging.INFO, "worker_stopped", "worker stopped")


async def _orphaned(parent: int, stop: Callable[[str], None]) -> None:
    """Stop a forked worker whose supervisor died (it was killed: it could not pass the signal on)."""
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    stop("supervisor gone")


def _run_worker(
    config: ServeConfig, sock: socket.socket, store_url: str, parent: int | None = None, spoe: socket.socket | None = None
) -> int:
    try:
        worker = Worker(config, store_url)
    except Exception as exc:
        _event(logging.ERROR, "worker_failed", f"the worker could not start: {exc}", error=type(exc).__name__)
        return 1
    asyncio.run(worker.serve(sock, parent, spoe))
    return 0


# -- the parent ------------------------------------------------------------------------------------


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY for IPPROTO_TCP only
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _check(config: ServeConfig) -> str | None:
    """Validate everything before binding or forking (a broken file is an error at start-up); the
    store URL: ``--store``, else the policy's ``settings.store``, else ``None`` (the default)."""
    if config.policy is None and not config.envoy:
        raise ConfigurationError("nothing to serve: give a ratewarden policy file and/or Envoy ratelimit YAML")
    if config.workers < 1:
        raise ConfigurationError(f"--workers must be at least 1, got {config.workers}")
    if config.spoe is not None and config.policy is None:
        raise ConfigurationError("--spoe answers HAProxy with a ratewarden policy: give a policy file")
    parse_networks(config.trusted_proxies)
    store = config.store
    if config.policy is not None:
        store = store or load_policy(config.policy).store
    if config.envoy:
        _load_envoy(config.envoy)
    if store is not None:
        check_store_url(store)
    return store


def run(config: ServeConfig) -> int:
    """Run the service until ``SIGTERM``/``SIGINT``; the exit status (0 after a clean stop).

    Args:
        config: What to serve and how.
    """
    configure_logging(config.log_format, config.log_level)
    try:
        store_url = _check(config)
        config = fit_open_files(config)
        sock = _bind(*config.http)
        spoe = _bind(*config.spoe) if config.spoe is not None else None
    except (ConfigurationError, OSError, ImportError) as exc:
        _event(logging.ERROR, "config_error", str(exc))
        return 2
    shm: Any = None
    if store_url is None:
        if config.workers == 1:
            store_url = "memory://"
        else:  # one table for the workers of this run, removed when it ends
            store_url = f"shm://serve-{os.getpid()}"
            shm = open_store(store_url)
    elif config.workers > 1 and store_url.lower().startswith("memory:"):
        _event(logging.WARNING, "store_per_worker", "memory:// counts per worker: each admits the whole limit")
    host, port = sock.getsockname()[:2]
    _event(
        logging.INFO, "started", "ratewarden serve started", http=f"{host}:{port}",
        grpc="{}:{}".format(*config.grpc) if config.grpc and config.envoy else None,
        spoe="{}:{}".format(*spoe.getsockname()[:2]) if spoe is not None else None, workers=config.workers,
        store=_redacted(store_url), policy=config.policy, envoy=[str(p) for p in config.envoy],
    )
    try:
        if config.workers == 1:
            return _run_worker(config, sock, store_url, spoe=spoe)
        metrics_directory = _shared_metrics_directory() if config.metrics else None
        try:
            return _supervise(config, sock, store_url, spoe)
        finally:
            if metrics_directory is not None:
                shutil.rmtree(metrics_directory, ignore_errors=True)
    finally:
        sock.close()
        if spoe is not None:
            spoe.close()
        if shm is not None:
            asyncio.run(shm.close())
            shm.unlink()
        _event(logging.INFO, "exited", "ratewarden serve exited")


#: Open files a worker keeps for itself beside its connections (store, gRPC, listening sockets, logs, metrics).
_RESERVED_FILES = 64


def fit_open_files(config: ServeConfig) -> ServeConfig:
    """``config`` with connection caps a worker can hold: the open-files soft limit is raised toward
    the hard one as far as the caps need, and caps still above it are lowered (logged), so a flood of
    connections is refused by the caps instead of leaving the worker unable to accept (EMFILE).

    Args:
        config: What to serve.
    """
    try:
        import resource
    except ImportError:  # not POSIX
        return config
    spoe = config.spoe_max_connections if config.spoe is not None else 0
    wanted = config.http_max_connections + spoe + _RESERVED_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return config
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if raised > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft >= wanted:
        return config
    room = max(2, soft - _RESERVED_FILES)
    http = max(1, room * config.http_max_connections // (config.http_max_connections + spoe))
    fitted = replace(config, http_max_connections=http, spoe_max_connections=max(1, room - http) if spoe else spoe)
    _event(
        logging.WARNING, "bounds_lowered", "connection caps lowered to fit the open files limit (ulimit -n)",
        open_files=soft, http_max_connections=fitted.http_max_connections,
        spoe_max_connections=fitted.spoe_max_connections if spoe else None,
    )
    return fitted


def _redacted(url: str) -> str:
    from ..stores.urls import redact

    return redact(url)


def _supervise(config: ServeConfig, sock: socket.socket, store_url: str, spoe: socket.socket | None = None) -> int:
    """Fork the workers and watch them until told to stop."""
    pending: list[int] = []
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    previous = {s: signal.signal(s, lambda signum, frame: pending.append(signum)) for s in handled}
    children: dict[int, tuple[int, float]] = {}  # pid -> (worker index, start time)
    parent = os.getpid()

    def spawn(index: int) -> None:
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                for s in handled:
                    signal.signal(s, signal.SIG_DFL)
                status = _run_worker(config, sock, store_url, parent, spoe)
            finally:
                logging.shutdown()
                os._exit(status)
        children[pid] = (index, time.monotonic())

    for index in range(config.workers):
        spawn(index)
    stopping = failed = False
    try:
        while children:
            while pending:
                signum = pending.pop(0)
                if signum in (signal.SIGTERM, signal.SIGINT):
                    stopping = True
                _signal_all(children, signal.SIGTERM if signum == signal.SIGINT else signum)
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.05)
                continue
            index, started = children.pop(pid)
            if stopping:
                continue
            code = os.waitstatus_to_exitcode(status)
            if code == 1 and time.monotonic() - started < _CRASH_LOOP:  # it could not start: it would not again
                _event(logging.ERROR, "worker_failed", "a worker failed at start-up; stopping", worker=index, code=code)
                failed = stopping = True
                _signal_all(children, signal.SIGTERM)
                continue
            _event(logging.ERROR, "worker_exited", "a worker exited; starting another", worker=index, pid=pid, code=code)
            spawn(index)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 1 if failed else 0


def _signal_all(children: dict[int, tuple[int, float]], signum: int) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080``, ``:8080`` for all interfaces) into ``(host, port)``.

    Args:
        text: The address.
        what: The option's name, for the error.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigurationError(f"{what} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)

