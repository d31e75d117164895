"""envoyproxy/ratelimit's ``GET /healthcheck``, as its ``HealthChecker`` answers it: ``200`` and ``OK``
while every component is healthy, else ``500`` with an empty body. Its components:

- ``sigterm``: unhealthy from the stop signal on (the service drains; the load balancer should
  stop sending);
- ``config`` (only with ``HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED``): unhealthy until a configuration
  with at least one domain is loaded, and again if a reload leaves none;
- ``redis`` (only with ``REDIS_HEALTH_CHECK_ACTIVE_CONNECTION``): unhealthy while the store does not
  answer (a read that charges nothing, as ``/healthz`` probes it).

Without ``--envoy-env`` only ``sigterm`` applies (ratewarden's own ``/healthz`` says more).
"""

from __future__ import annotations

from typing import Any

from ..store_health import innermost, probe_store

__all__ = ["healthcheck"]


async def healthcheck(app: Any) -> tuple[int, bytes]:
    """The reference's ``/healthcheck`` answer for ``app`` (a ``ServeApp``): ``(status, body)``.

    Args:
        app: The service's app: its ``stopping`` flag, its ``reference`` options, its Envoy service and limiter.
    """
    if app.stopping:
        return 500, b""
    options = app.reference
    if options is not None and options.healthy_with_config and (app.rls is None or not app.rls.domains):
        return 500, b""
    if options is not None and options.health_store:
        limiter = app.limiter
        limits = limiter.limits("1/s")
        error = await probe_store(innermost(limiter.store), limiter.keys_for("ratewarden:healthz", limits), limits, 2.0)
        if error is not None:
            return 500, b""
    return 200, b"OK"
