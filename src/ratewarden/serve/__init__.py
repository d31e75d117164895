"""``ratewarden serve``: a rate-limit decision service for gateways (nginx, HAProxy, Traefik, Envoy).

``http.ServeApp`` is the pure-ASGI check API (``/check``, ``/v1/check``, ``/json``, ``/healthz``,
``/metrics``); ``process`` runs it with workers, reloads and graceful shutdown; ``grpc`` serves
Envoy's rate limit service API. Nothing here is imported by ``import ratewarden``.
"""
