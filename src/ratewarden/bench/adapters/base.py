"""What every library adapter provides: build the benchmark app for a scenario, and reset its state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from ...errors import RatewardenError
from ..apps import ASGIApp
from ..scenarios import Scenario

__all__ = ["Adapter", "StoreSpec", "Unsupported"]

_S = TypeVar("_S")


class Unsupported(RatewardenError):
    """This library cannot run this scenario/store (the message says why); the row is skipped, not failed."""


@dataclass(frozen=True)
class StoreSpec:
    """Which store the limiter uses: ``memory``, ``shm``, ``redis``, ``redis-cluster`` or ``memcached``, with its URL.

    A cluster URL is ``redis+cluster://host:port`` (any one node; clients discover the rest); an ``shm``
    URL is ``shm://<name>?directory=...`` (one host's shared memory).
    """

    kind: str = "memory"
    url: str = ""

    @property
    def host_port(self) -> tuple[str, int]:
        rest = self.url.split("://", 1)[-1].split("/", 1)[0]
        host, _, port = rest.rpartition(":")
        return host or "127.0.0.1", int(port or (11211 if self.kind == "memcached" else 6379))

    @property
    def table_name(self) -> str:
        """The shared-memory table's name (``shm`` URLs)."""
        return self.url.split("://", 1)[-1].split("?", 1)[0]


class Adapter(ABC):
    """One library under test. ``build`` raises :class:`Unsupported` for scenarios it cannot express."""

    name: ClassVar[str]

    def __init__(self, scenario: Scenario, store: StoreSpec) -> None:
        self.scenario = scenario
        self.store = store

    @abstractmethod
    def build(self) -> ASGIApp:
        """The ASGI app for this scenario (routes from :func:`ratewarden.bench.apps.build_app`)."""

    def strategy(self, strategies: Mapping[str, _S]) -> _S:
        """The library's strategy for the scenario's algorithm (``strategies``: by algorithm name), or
        ``Unsupported`` naming the algorithm the library lacks."""
        found = strategies.get(self.scenario.algorithm)
        if found is None:
            raise Unsupported(f"{self.name} has no {self.scenario.algorithm} strategy")
        return found

    async def start(self) -> None:
        """Open connections / initialise backends (called once before the first request)."""

    async def reset(self) -> None:
        """Forget every counter (called before each iteration; the harness also flushes Redis/Memcached)."""

    async def stop(self) -> None:
        """Release connections."""

    def without_store(self) -> dict[str, int] | None:
        """Checks decided without the store so far, by reason, for a limiter that counts them
        (None for one that does not)."""
        return None
