"""Running ``ratewarden serve``: the parent validates the configuration, binds the sockets and forks
``--workers N`` processes (``serve.worker``) before anything imports grpc, then only supervises: it
forwards ``SIGHUP`` and ``SIGTERM``/``SIGINT``, restarts a worker that died, and removes the
shared-memory table it created when it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import signal
import socket
import time
from dataclasses import replace
from typing import Any

from ..errors import ConfigurationError
from ..policy.loader import load_policy
from ..stores import open_store
from ..stores.urls import check_store_url
from .config import ServeConfig, bind_listener, check_listen, format_address, load_envoy
from .http import parse_networks
from .logs import configure_logging, event
from .worker import run_worker, shared_metrics_directory

__all__ = ["fit_open_files", "run"]

#: A worker that exits with status 1 this soon (seconds) after its start could not start: the service stops
#: (a worker that dies later, or of a signal, is replaced).
_CRASH_LOOP = 2.0


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket as the service binds its HTTP one (``bench.gateway_floor`` binds its own so)."""
    return bind_listener("--http", (host, port))


def _listeners(config: ServeConfig) -> list[tuple[str, tuple[str, int]]]:
    """The listeners this run opens, by option: HTTP, SPOE with ``--spoe``, gRPC with an Envoy configuration."""
    found = [("--http", config.http)]
    if config.spoe is not None:
        found.append(("--spoe", config.spoe))
    if config.serves_envoy and config.grpc is not None:
        found.append(("--grpc", config.grpc))
    if config.reference is not None and config.reference.prometheus is not None:
        found.append(("PROMETHEUS_ADDR", config.reference.prometheus))
    return found


def _overlap(host: str, other: str) -> bool:
    """Whether listeners on ``host`` and ``other`` (one port) would take the same address: the same
    host, or one of them every address of its family (``::`` is both families, as Linux binds it)."""
    return host == other or any(
        wild == "::" or (wild == "0.0.0.0" and ":" not in rest) for wild, rest in ((host, other), (other, host))
    )


def _check_distinct(listeners: list[tuple[str, tuple[str, int]]]) -> None:
    """Two listeners on one port of one address would refuse each other: said as such, before the
    bind would call it "in use"."""
    for index, (option, (host, port)) in enumerate(listeners):
        for other, (other_host, other_port) in listeners[:index]:
            if port == other_port and port != 0 and _overlap(host, other_host):
                raise ConfigurationError(
                    f"{option} {format_address((host, port))}: {other} {format_address((other_host, other_port))} "
                    f"listens there: give {option} its own port"
                )


def _check_grpc_host(config: ServeConfig) -> None:
    """The compiled gRPC front door listens on an IP address only: a host name is refused here, not
    as a worker's ``bad address`` later."""
    assert config.grpc is not None
    host, port = config.grpc
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if config.front == "compiled":
            raise ConfigurationError(
                f"--grpc {format_address(config.grpc)}: the compiled gRPC front door listens on an IP address, not a "
                f"host name: give one with --grpc (127.0.0.1:{port}, [::1]:{port}, 0.0.0.0:{port}), or --front python"
            ) from None


def _open_listeners(config: ServeConfig) -> tuple[socket.socket, socket.socket | None, socket.socket | None]:
    """Bind the HTTP, SPOE and (``--envoy-env``) Prometheus sockets the workers share, and check that
    gRPC's address (each worker opens its own listener there) can be listened on, all before ``started``
    and before forking: a listener that cannot be opened is a ``ConfigurationError`` naming its option,
    address and the fix."""
    _check_distinct(_listeners(config))
    with contextlib.ExitStack() as opened:  # closed again when a later one fails
        sock = opened.enter_context(bind_listener("--http", config.http))
        spoe = opened.enter_context(bind_listener("--spoe", config.spoe)) if config.spoe is not None else None
        prometheus = config.reference.prometheus if config.reference is not None else None
        scrape = opened.enter_context(bind_listener("PROMETHEUS_ADDR", prometheus)) if prometheus is not None else None
        if config.serves_envoy and config.grpc is not None:
            _check_grpc_host(config)
            check_listen("--grpc", config.grpc)
        opened.pop_all()
    return sock, spoe, scrape


def _check(config: ServeConfig) -> str | None:
    """Validate everything before binding or forking (a broken file is an error at start-up); the
    store URL: ``--store``, else the policy's ``settings.store``, else ``None`` (the default)."""
    if config.policy is None and not config.serves_envoy:
        raise ConfigurationError("nothing to serve: give a ratewarden policy file and/or Envoy ratelimit YAML")
    if config.workers < 1:
        raise ConfigurationError(f"--workers must be at least 1, got {config.workers}")
    if config.spoe is not None and config.policy is None:
        raise ConfigurationError("--spoe answers HAProxy with a ratewarden policy: give a policy file")
    parse_networks(config.trusted_proxies)
    store = config.store
    if config.policy is not None:
        store = store or load_policy(config.policy).store
    if config.serves_envoy:
        load_envoy(config.envoy_paths(), config.envoy_merge_domains)
        from .rls import CHARGES, HEADER_STYLES

        if config.envoy_headers not in HEADER_STYLES:
            raise ConfigurationError(f"--envoy-headers must be one of {', '.join(HEADER_STYLES)}, got {config.envoy_headers!r}")
        if config.envoy_charge not in CHARGES:
            raise ConfigurationError(f"--envoy-charge must be one of {', '.join(CHARGES)}, got {config.envoy_charge!r}")
    if store is not None:
        check_store_url(store)
    return store


def run(config: ServeConfig) -> int:
    """Run the service until ``SIGTERM``/``SIGINT``; the exit status (0 after a clean stop).

    Args:
        config: What to serve and how.
    """
    configure_logging(config.log_format, config.log_level)
    for setting, why in config.notes:  # --envoy-env: what is not supported, named once
        event(logging.WARNING, "envoy_env_unsupported", f"{setting}: not supported: {why}", setting=setting)
    try:
        store_url = _check(config)
        config = _choose_front(config)
        config = fit_open_files(config)
        sock, spoe, scrape = _open_listeners(config)
    except (ConfigurationError, OSError, ImportError) as exc:
        event(logging.ERROR, "config_error", str(exc))
        return 2
    shm: Any = None
    if store_url is None:
        if config.workers == 1:
            store_url = "memory://"
        else:  # one table for the workers of this run, removed when it ends
            store_url = f"shm://serve-{os.getpid()}"
            shm = open_store(store_url)
    elif config.workers > 1 and store_url.lower().startswith("memory:"):
        event(logging.WARNING, "store_per_worker", "memory:// counts per worker: each admits the whole limit")
    host, port = sock.getsockname()[:2]
    event(
        logging.INFO, "started", "ratewarden serve started", http=f"{host}:{port}",
        grpc="{}:{}".format(*config.grpc) if config.grpc and config.serves_envoy else None,
        front=config.front if config.grpc and config.serves_envoy else None, http_front=config.http_front,
        spoe_front=config.spoe_front if spoe is not None else None,
        spoe="{}:{}".format(*spoe.getsockname()[:2]) if spoe is not None else None, workers=config.workers,
        store=_redacted(store_url), policy=config.policy, envoy=[str(p) for p in config.envoy_paths()],
        runtime=config.runtime.describe() if config.runtime is not None else None,
        prometheus="{}:{}".format(*scrape.getsockname()[:2]) if scrape is not None else None,
    )
    try:
        if config.workers == 1:
            return run_worker(config, sock, store_url, spoe=spoe, scrape=scrape)
        metrics_directory = shared_metrics_directory() if config.metrics or scrape is not None else None
        try:
            return _supervise(config, sock, store_url, spoe, scrape)
        finally:
            if metrics_directory is not None:
                shutil.rmtree(metrics_directory, ignore_errors=True)
    finally:
        sock.close()
        for other in (spoe, scrape):
            if other is not None:
                other.close()
        if shm is not None:
            asyncio.run(shm.close())
            shm.unlink()
        event(logging.INFO, "exited", "ratewarden serve exited")


def _choose_front(config: ServeConfig) -> ServeConfig:
    """``config`` with ``front``, ``http_front`` and ``spoe_front`` the front doors that run, ``compiled``
    or ``python`` (chosen once, before forking); ``auto`` falling back to python says why in one log line
    (the first door that falls back: the others fall back for the same reason)."""
    from .front import choose_front

    chosen: dict[str, str] = {}
    for field, option, kind, used in (("front", "--front", "gRPC", config.serves_envoy),
                                      ("http_front", "--http-front", "HTTP", True),
                                      ("spoe_front", "--spoe-front", "SPOE", config.spoe is not None)):
        requested = getattr(config, field)
        front, why = choose_front(requested, option)
        if used and front == "python" and requested == "auto" and "python" not in chosen.values():
            event(logging.WARNING, "front_python", f"{kind} through the python front door: {why}", reason=why)
        chosen[field] = front
    return replace(config, front=chosen["front"], http_front=chosen["http_front"], spoe_front=chosen["spoe_front"])


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
    grpc = config.grpc_max_connections if config.serves_envoy and config.front == "compiled" else 0
    wanted = config.http_max_connections + spoe + grpc + _RESERVED_FILES
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
    total = config.http_max_connections + spoe + grpc
    http = max(1, room * config.http_max_connections // total)
    if grpc:  # the last cap takes what the others leave
        spoe_fit = max(1, room * spoe // total) if spoe else spoe
        grpc = max(1, room - http - spoe_fit)
    else:
        spoe_fit = max(1, room - http) if spoe else spoe
    fitted = replace(
        config, http_max_connections=http, spoe_max_connections=spoe_fit,
        grpc_max_connections=grpc or config.grpc_max_connections,
    )
    event(
        logging.WARNING, "bounds_lowered", "connection caps lowered to fit the open files limit (ulimit -n)",
        open_files=soft, http_max_connections=fitted.http_max_connections,
        spoe_max_connections=fitted.spoe_max_connections if spoe else None,
        grpc_max_connections=fitted.grpc_max_connections if grpc else None,
    )
    return fitted


def _redacted(url: str) -> str:
    from ..stores.urls import redact

    return redact(url)


def _supervise(
    config: ServeConfig, sock: socket.socket, store_url: str, spoe: socket.socket | None = None,
    scrape: socket.socket | None = None,
) -> int:
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
                status = run_worker(config, sock, store_url, parent, spoe, scrape)
            finally:
                logging.shutdown()
                os._exit(status)
        children[pid] = (index, time.monotonic())

    for index in range(config.workers):
        spawn(index)
    stopping = False
    failed = 0  # the exit status a worker that could not start leaves: 2 could not listen, 1 anything else
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
            could_not_listen = code == 2  # its config_error line names the option, the address and the fix
            if could_not_listen or (code == 1 and time.monotonic() - started < _CRASH_LOOP):  # it would not again
                why = "could not open its listeners" if could_not_listen else "failed at start-up"
                event(logging.ERROR, "worker_failed", f"a worker {why}; stopping", worker=index, code=code)
                failed, stopping = code, True
                _signal_all(children, signal.SIGTERM)
                continue
            event(logging.ERROR, "worker_exited", "a worker exited; starting another", worker=index, pid=pid, code=code)
            spawn(index)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return failed


def _signal_all(children: dict[int, tuple[int, float]], signum: int) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
