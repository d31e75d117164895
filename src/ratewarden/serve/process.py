"""Running ``ratewarden serve``: the parent validates the configuration, binds the sockets and forks
``--workers N`` processes (``serve.worker``) before anything imports grpc, then only supervises: it
forwards ``SIGHUP`` and ``SIGTERM``/``SIGINT``, restarts a worker that died, and removes the
shared-memory table it created when it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from .config import ServeConfig, load_envoy
from .http import parse_networks
from .logs import configure_logging, event
from .worker import run_worker, shared_metrics_directory

__all__ = ["fit_open_files", "run"]

#: A worker that exits with status 1 this soon (seconds) after its start could not start: the service stops
#: (a worker that dies later, or of a signal, is replaced).
_CRASH_LOOP = 2.0


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
        load_envoy(config.envoy, config.envoy_merge_domains)
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
    try:
        store_url = _check(config)
        config = _choose_front(config)
        config = fit_open_files(config)
        sock = _bind(*config.http)
        spoe = _bind(*config.spoe) if config.spoe is not None else None
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
        grpc="{}:{}".format(*config.grpc) if config.grpc and config.envoy else None,
        front=config.front if config.grpc and config.envoy else None, http_front=config.http_front,
        spoe_front=config.spoe_front if spoe is not None else None,
        spoe="{}:{}".format(*spoe.getsockname()[:2]) if spoe is not None else None, workers=config.workers,
        store=_redacted(store_url), policy=config.policy, envoy=[str(p) for p in config.envoy],
    )
    try:
        if config.workers == 1:
            return run_worker(config, sock, store_url, spoe=spoe)
        metrics_directory = shared_metrics_directory() if config.metrics else None
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
        event(logging.INFO, "exited", "ratewarden serve exited")


def _choose_front(config: ServeConfig) -> ServeConfig:
    """``config`` with ``front``, ``http_front`` and ``spoe_front`` the front doors that run, ``compiled``
    or ``python`` (chosen once, before forking); ``auto`` falling back to python says why in one log line
    (the first door that falls back: the others fall back for the same reason)."""
    from .front import choose_front

    chosen: dict[str, str] = {}
    for field, option, kind, used in (("front", "--front", "gRPC", bool(config.envoy)),
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
    grpc = config.grpc_max_connections if config.envoy and config.front == "compiled" else 0
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
                status = run_worker(config, sock, store_url, parent, spoe)
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
                event(logging.ERROR, "worker_failed", "a worker failed at start-up; stopping", worker=index, code=code)
                failed = stopping = True
                _signal_all(children, signal.SIGTERM)
                continue
            event(logging.ERROR, "worker_exited", "a worker exited; starting another", worker=index, pid=pid, code=code)
            spawn(index)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 1 if failed else 0


def _signal_all(children: dict[int, tuple[int, float]], signum: int) -> None:
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
