"""One ``ratewarden serve`` worker process (``Worker``): its limiter and app, uvicorn for HTTP,
gRPC and HAProxy's SPOE in the same event loop, its reloads (``SIGHUP`` and file changes), its
metrics (summed over the workers) and its graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import logging
import os
import signal
import socket
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ..errors import ConfigurationError
from ..limiter import Limiter
from ..policy.loader import load_policy
from ..policy.reload import PolicyReloader
from ..policy.schema import Policy
from ..stores import open_store
from . import bounds
from .config import ServeConfig, listen_error, load_envoy
from .http import ServeApp
from .logs import event, log

__all__ = ["GRACE", "Worker", "run_worker", "shared_metrics_directory", "uvicorn_server"]

#: Seconds a worker waits for in-flight requests (HTTP and gRPC) when asked to stop.
GRACE = 10
#: The cyclic collector's youngest-generation threshold in a serving worker (CPython's default: 700).
GC_THRESHOLD = 10_000


def settle_gc() -> None:
    """Once a worker has loaded: move what it loaded out of the collector's sight (``gc.freeze``) and
    collect the youngest generation less often. Requests allocate and free their objects by reference
    counting; the collector only looks for cycles, and at the default threshold it ran every few dozen
    decisions, re-walking the survivors. Memory stays bounded: every per-process cache is bounded."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


def _rate_limit_service(domains: Any, limiter: Limiter, config: ServeConfig) -> Any:
    options: dict[str, Any] = {
        "headers": config.envoy_headers, "charge": config.envoy_charge, "max_descriptors": config.max_descriptors,
        "max_entries": config.max_entries,
    }
    if config.reference is not None:  # --envoy-env: the reference's service-wide settings and metrics
        reference: Any = importlib.import_module(f"{__package__}.reference_service")
        metrics = None
        if config.reference.prometheus is not None:
            from .reference_metrics import ReferenceMetrics, shared_counts

            metrics = ReferenceMetrics(shared=shared_counts() and config.workers > 1)
        return reference.ReferenceService(domains, limiter, options=config.reference, metrics=metrics, **options)
    rls: Any = importlib.import_module(f"{__package__}.rls")
    return rls.RateLimitService(domains, limiter, **options)


def uvicorn_server(app: ServeApp, sock: socket.socket, config: ServeConfig | None = None) -> Any:
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


def shared_metrics_directory() -> str | None:
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
        self.limiter = Limiter(  # --envoy-env: CACHE_KEY_PREFIX, else Limiter's own prefix
            open_store(store_url), on_error=config.on_error, workers=config.workers, prefix=config.key_prefix or "rw")
        self.metrics = _metrics() if config.metrics else None
        # Each file's signature is taken before it is read: a file written in between is then seen
        # as changed at the next poll, not taken as already loaded.
        self.reloader = (
            PolicyReloader(config.policy, self._apply, interval=config.watch or 1.0) if config.policy else None
        )
        policy = load_policy(config.policy) if config.policy is not None else None
        if self.reloader is not None:
            self.reloader.policy = policy
        self._envoy_signature = self._signature()
        self.rls = (
            _rate_limit_service(load_envoy(config.envoy_paths(), config.envoy_merge_domains), self.limiter, config)
            if config.serves_envoy else None
        )
        shared = self.metrics is not None and bool(os.environ.get(_MULTIPROCESS)) and config.workers > 1
        self.app = ServeApp(
            self.limiter, policy, trusted_proxies=config.trusted_proxies, metrics=self.metrics, rls=self.rls,
            exposition=_total_exposition(self.metrics) if shared else None, reference=config.reference,
        )

    def _apply(self, policy: Policy) -> None:
        self.app.apply_policy(policy)

    def _signature(self) -> tuple[object, ...]:
        if self.config.runtime is not None:  # the reference's runtime directory: its swap, its files
            return self.config.runtime.signature()
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
            self._report(ok, "policy", self.config.policy, reason, self.reloader.last_error, self.reloader.last_changes)
        if self.config.serves_envoy:
            self._reload_envoy(reason)

    def poll(self) -> None:
        """Reload the files that changed."""
        if self.reloader is not None:
            changed = self.reloader.check()
            if changed is not None:
                self._report(
                    changed, "policy", self.config.policy, "file changed", self.reloader.last_error,
                    self.reloader.last_changes,
                )
        if self.config.serves_envoy and self._signature() != self._envoy_signature:
            self._reload_envoy("file changed")

    def _reload_envoy(self, reason: str) -> None:
        self._envoy_signature = self._signature()
        paths = self.config.envoy_paths()
        try:
            domains = load_envoy(paths, self.config.envoy_merge_domains)
        except Exception as exc:
            self._report(False, "envoy", paths, reason, exc)
            return
        if self.rls is not None:
            self.rls.replace(domains)
        self._report(True, "envoy", [str(path) for path in paths], reason, None)

    @staticmethod
    def _report(
        ok: bool, kind: str, path: object, reason: str, error: BaseException | None,
        changes: dict[str, list[str]] | None = None,
    ) -> None:
        if ok:
            event(
                logging.INFO, "reloaded", f"{kind} configuration reloaded", kind=kind, path=path, reason=reason,
                **(changes or {}),
            )
        else:
            event(
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

    async def _start_grpc(self) -> Any:
        """Start gRPC on the front door ``config.front`` names (``serve.front``); returns what ``stop(grace)``
        ends. An address it cannot listen on is a ``ConfigurationError`` naming ``--grpc``, the address
        and the fix (``config.listen_error``)."""
        config, address = self.config, self.config.grpc
        assert self.rls is not None and address is not None
        front: Any = importlib.import_module(f"{__package__}.front")
        try:
            if front.choose_front(config.front)[0] == "compiled":
                compiled = front.start_front(
                    self.rls, *address, reuse_port=config.workers > 1, max_message_size=config.grpc_max_message_size,
                    max_descriptors=config.max_descriptors, max_entries=config.max_entries,
                    max_connections=config.grpc_max_connections, timeout=config.grpc_timeout,
                    handshake_timeout=config.grpc_handshake_timeout,
                )
                self.app.doors.append(compiled.stalled)
                return compiled
            grpc_module: Any = importlib.import_module(f"{__package__}.grpc")
            started = await grpc_module.start_grpc(
                self.rls, *address, reuse_port=config.workers > 1, max_message_size=config.grpc_max_message_size,
                handshake_timeout=config.grpc_handshake_timeout, timeout=config.grpc_timeout,
            )
        except (OSError, ValueError) as exc:  # the port taken since the supervisor's check, or never checked
            raise listen_error("--grpc", address, exc, probe=True) from None
        return started[0] if isinstance(started, tuple) else started

    def _http_server(self, sock: socket.socket) -> Any:
        """The HTTP server ``config.http_front`` names: uvicorn, or the compiled front door
        (``serve.front_http``); either stops when ``should_exit`` is set."""
        config = self.config
        if config.http_front != "compiled":
            return uvicorn_server(self.app, sock, config)
        front_http: Any = importlib.import_module(f"{__package__}.front_http")
        return front_http.start_http_front(
            self.app, sock, max_connections=config.http_max_connections, timeout=config.http_timeout,
            max_header_size=config.http_max_header_size, grace=GRACE,
        )

    async def _start_spoe(self, sock: socket.socket) -> tuple[Any, Callable[[], Awaitable[None]]]:
        """Start HAProxy's SPOE agent on ``sock`` on the front door ``config.spoe_front`` names (the
        Python agent, or ``serve.front_spoe``): what ``close()`` stops accepting, and what ends the
        open connections."""
        from .spoe import SpoeAgent, start_spoe

        config = self.config
        agent = SpoeAgent(
            self.app, max_connections=config.spoe_max_connections, timeout_hello=config.spoe_timeout_hello,
            timeout_idle=config.spoe_timeout_idle, timeout_frame=config.spoe_timeout_frame, message=config.spoe_message,
        )
        if config.spoe_front == "compiled":
            front_spoe: Any = importlib.import_module(f"{__package__}.front_spoe")
            compiled = front_spoe.start_spoe_front(self.app, sock, agent)
            return compiled, compiled.end
        return await start_spoe(self.app, sock, agent), agent.close

    async def serve(
        self, sock: socket.socket, parent: int | None = None, spoe: socket.socket | None = None,
        scrape: socket.socket | None = None,
    ) -> None:
        """Serve HTTP on ``sock`` (gRPC, HAProxy's SPOE on ``spoe`` and the reference's Prometheus
        metrics on ``scrape`` when configured) until ``SIGTERM``/``SIGINT`` (or, for a forked worker,
        until its ``parent`` is gone)."""
        loop = asyncio.get_running_loop()
        grpc_server: Any = None
        if self.rls is not None and self.config.grpc is not None:  # first: the one listener opened here
            try:
                grpc_server = await self._start_grpc()
            except BaseException:
                await self._close()
                raise
        server = self._http_server(sock)
        spoe_server: Any = None
        spoe_end: Callable[[], Awaitable[None]] | None = None
        stopping: list[asyncio.Task[Any]] = []

        def stop(reason: str) -> None:
            if server.should_exit:
                return
            event(logging.INFO, "stopping", "stopping: finishing in-flight requests", reason=reason)
            server.should_exit = True
            self.app.stopping = True  # /healthcheck answers 500 from now on, as the reference's after SIGTERM
            if spoe_server is not None:  # no new SPOE connection; open ones end when HAProxy closes them
                spoe_server.close()
            if grpc_server is not None:  # both servers drain at once
                stopping.append(loop.create_task(grpc_server.stop(GRACE)))

        def hup() -> None:
            loop.run_in_executor(None, self.reload, "SIGHUP")

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop, signal.Signals(signum).name)
        loop.add_signal_handler(signal.SIGHUP, hup)
        if spoe is not None:
            spoe_server, spoe_end = await self._start_spoe(spoe)
        scraped = await self._start_scrape(scrape) if scrape is not None else None
        tasks = [asyncio.create_task(self._watch())] if self.config.watch > 0 else []
        if parent is not None:
            tasks.append(asyncio.create_task(_orphaned(parent, stop)))
        await self.limiter.check_store()
        settle_gc()
        event(logging.INFO, "worker_started", "worker serving", http="{}:{}".format(*sock.getsockname()[:2]))
        try:
            await server.serve(sockets=[sock])
        finally:
            for task in tasks:
                task.cancel()
            if scraped is not None:
                scraped.close()
            if spoe_end is not None:  # served through the HTTP drain; ended before the store closes
                spoe_server.close()
                await spoe_end()
            if grpc_server is not None:
                await (stopping[0] if stopping else grpc_server.stop(GRACE))
            await self._close()
            event(logging.INFO, "worker_stopped", "worker stopped")

    async def _start_scrape(self, sock: socket.socket) -> Any:
        """Serve the reference's Prometheus metrics (``--envoy-env``, ``USE_PROMETHEUS``) on ``sock``."""
        from .reference_metrics import serve_prometheus

        metrics = getattr(self.rls, "metrics", None)
        assert self.config.reference is not None and metrics is not None
        return await serve_prometheus(sock, self.config.reference.prometheus_path, metrics.exposition)

    async def _close(self) -> None:
        """Close the metrics and the store (last, once nothing decides any more)."""
        if self.metrics is not None:
            self.metrics.close()
        await self.limiter.close()


async def _orphaned(parent: int, stop: Callable[[str], None]) -> None:
    """Stop a forked worker whose supervisor died (it was killed: it could not pass the signal on)."""
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    stop("supervisor gone")


def run_worker(
    config: ServeConfig, sock: socket.socket, store_url: str, parent: int | None = None,
    spoe: socket.socket | None = None, scrape: socket.socket | None = None,
) -> int:
    """Run one worker until it is told to stop; its exit status: 0 after a clean stop, 1 when it could
    not start, 2 when a listener could not be opened (one ``config_error`` line naming the option,
    the address and the fix).

    Args:
        config: What to serve.
        sock: The HTTP listening socket.
        store_url: Where the counts live.
        parent: The supervisor's pid, for a forked worker (it stops when the supervisor is gone).
        spoe: The SPOE listening socket, with ``--spoe``.
        scrape: The reference's Prometheus listening socket, with ``--envoy-env`` and ``USE_PROMETHEUS``.
    """
    try:
        worker = Worker(config, store_url)
    except Exception as exc:
        event(logging.ERROR, "worker_failed", f"the worker could not start: {exc}", error=type(exc).__name__)
        return 1
    try:
        asyncio.run(worker.serve(sock, parent, spoe, scrape))
    except ConfigurationError as exc:
        event(logging.ERROR, "config_error", str(exc))
        return 2
    return 0
