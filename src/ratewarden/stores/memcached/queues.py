"""The single-key checks waiting for their key's next batch (``batches`` decides them)."""

from __future__ import annotations

import asyncio

from ...decision import Decision
from ...limits import Limit


class Check:
    """A single-key check queued for its key's batch."""

    __slots__ = ("cost", "future", "limit")

    def __init__(self, limit: Limit, cost: float, future: asyncio.Future[Decision]) -> None:
        self.limit = limit
        self.cost = cost
        self.future = future


class Queue:
    """The checks waiting for one key's next batch, and the task running its batches."""

    __slots__ = ("key", "leader", "settling", "waiting")

    def __init__(self, key: str) -> None:
        self.key = key
        self.waiting: list[Check] = []
        self.leader: asyncio.Future[None] | None = None
        self.settling = False  # a write that got no answer is being settled (and put back)
