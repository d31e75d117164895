"""The fuzz tests' doors (one ``ratewarden serve`` process per front door, started once per session
and per xdist worker) and their hypothesis settings.

The ``ratewarden-fuzz-ci`` profile (the default) is derandomized and keeps no example database: each
run tries the same examples, a modest number per property, so CI is reproducible and bounded in time
(the directory runs in well under a minute). ``RATEWARDEN_FUZZ=explore`` draws new examples each run,
ten times as many, to look for bugs by hand: ``RATEWARDEN_FUZZ=explore pytest tests/fuzz``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from .doors import FRONTS, Door, require_front, start_door

_EXPLORE = os.environ.get("RATEWARDEN_FUZZ") == "explore"

settings.register_profile(
    "ratewarden-fuzz-ci", derandomize=True, database=None, deadline=None, print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
settings.register_profile(
    "ratewarden-fuzz-explore", derandomize=False, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
#: The profile every fuzz test's settings derive from (no global ``load_profile``: other tests'
#: hypothesis settings stay their own).
PROFILE = settings.get_profile("ratewarden-fuzz-explore" if _EXPLORE else "ratewarden-fuzz-ci")


def fuzz(max_examples: int) -> settings:
    """The settings of one fuzz property: ``max_examples`` (ten times as many when exploring)."""
    return settings(PROFILE, max_examples=max_examples * (10 if _EXPLORE else 1))


@pytest.fixture(scope="session")
def _door_processes() -> Iterator[dict[str, Door]]:
    """The doors started in this session (this xdist worker), by front door; stopped at its end."""
    doors: dict[str, Door] = {}
    yield doors
    for door in doors.values():
        door.stop()


@pytest.fixture(params=FRONTS)
def door(request: pytest.FixtureRequest, _door_processes: dict[str, Door],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    """The running door of each front door in turn (started on first use, kept for the session);
    after the test, it must still be alive, under its memory bound, with nothing wrong logged."""
    front: str = request.param
    require_front(front)
    found = _door_processes.get(front)
    if found is None or found.proc.poll() is not None or found.broken is not None:
        if found is not None:
            found.stop()
        found = _door_processes[front] = start_door(tmp_path_factory.mktemp(f"door-{front}"), front)
    found.alive()
    since = found.mark()
    yield found
    if found.broken is None:  # else the test failed with the input that broke it
        found.healthy(since)
