"""rate-limiter-flexible (Node, behind fastify): live rows only (``bench.rlflx`` runs them); in process
there is nothing to call, so every in-process scenario is skipped with the reason."""

from __future__ import annotations

from ..apps import ASGIApp
from .base import Adapter, Unsupported


class RlflxAdapter(Adapter):
    name = "rlflx"

    def build(self) -> ASGIApp:
        raise Unsupported("rate-limiter-flexible runs in the live scenarios only (fastify in its own Node "
                          "process, under wrk)")
