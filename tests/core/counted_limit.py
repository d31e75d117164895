"""``CountedLimit``: a ``RateLimit`` that counts how often FastAPI ran it (to tell a lifted
dependency from one FastAPI still solves)."""

# No ``from __future__ import annotations``: FastAPI before 0.115 cannot resolve string annotations
# on a callable instance's ``__call__`` (see ratewarden.fastapi).
from typing import Any

from fastapi import Request, Response

from ratewarden.decision import Decision
from ratewarden.fastapi import RateLimit


class CountedLimit(RateLimit):
    """``RateLimit`` with ``solved``: the number of times FastAPI called it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.solved = 0

    async def __call__(self, request: Request, response: Response) -> Decision | None:
        self.solved += 1
        return await super().__call__(request, response)
