"""The shared vectors on the memory store, and the vectors file itself."""

from __future__ import annotations

from typing import Any

import pytest

from ratewarden import MemoryStore
from ratewarden.algorithms import ALGORITHMS
from tests.shm import KINDS, local_store
from tests.vectors.runner import FakeClock, load_vectors, run_vector, run_vectors

VECTORS = load_vectors()


def test_vectors_cover_every_algorithm() -> None:
    assert {v["algorithm"] for v in VECTORS} == set(ALGORITHMS)
    for vector in VECTORS:
        assert any(not step["allowed"] for step in vector["steps"]), vector["name"]
        assert any(step["allowed"] for step in vector["steps"]), vector["name"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
async def test_vector_on_local_stores(vector: dict[str, Any], kind: str) -> None:
    await run_vector(lambda clock: local_store(kind, clock=clock), vector)


async def test_run_vectors_counts_steps() -> None:
    steps = await run_vectors(lambda clock: MemoryStore(clock=clock))
    assert steps == sum(len(v["steps"]) for v in VECTORS)


async def test_runner_reports_a_wrong_store() -> None:
    """The runner must catch a store that ignores time (so it can catch a broken remote store)."""

    class FrozenStore(MemoryStore):
        def __init__(self, clock: FakeClock) -> None:
            super().__init__(clock=lambda: 0.0)

    with pytest.raises(AssertionError, match="vector"):
        await run_vectors(FrozenStore)  # type: ignore[arg-type]
