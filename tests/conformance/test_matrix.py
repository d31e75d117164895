"""The conformance matrix: every case of ``cases.CASES`` through every door of ``DOORS``, compared
with the row's expectation (status of each send, every rate-limit header of the last answer, what
the store was charged), as amended by the row's explicit per-door ``differences``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from . import doors
from .cases import ANY, CASES, Case, Difference

#: Every door, by name: what runs a case through it.
DOORS: dict[str, Callable[..., Awaitable[doors.Run]]] = {
    "asgi": doors.door_asgi,
    "asgi-policy": doors.door_asgi_policy,
    "wsgi": doors.door_wsgi,
    "wsgi-policy": doors.door_wsgi_policy,
    "flask": doors.door_flask,
    "django": doors.door_django,
    "serve-check": doors.door_serve_check,
    "serve-v1-check": doors.door_serve_v1_check,
    "spoe": doors.door_spoe,
    "grpc": doors.door_grpc,
}
#: The doors behind ``ratewarden serve``'s HTTP server (one uvicorn for the module).
SERVED = ("serve-check", "serve-v1-check")
#: Names a door gives the rules' limits in its headers, when not the rule's name.
NAMES: dict[str, Callable[[Case], dict[str, str]]] = {
    "flask": lambda case: {spec.name: "items" + (f"-{i}" if i else "") for i, spec in enumerate(
        s for s in case.rules if not s.bypass)},
    "grpc": lambda case: dict(case.envoy.names) if case.envoy is not None else {},
}


def _params() -> Iterator[Any]:
    for case in CASES:
        for door in DOORS:
            diff: Difference | None = case.differences.get(door)
            assert door != "grpc" or case.envoy is not None or (diff is not None and diff.skip), (
                f"{case.id}: give its Envoy form, or say why gRPC cannot express it"
            )
            marks: list[Any] = []
            if diff is not None and diff.skip:
                marks.append(pytest.mark.skip(reason=f"{door} differs: {diff.why}"))
            elif diff is not None and diff.xfail:
                marks.append(pytest.mark.xfail(strict=True, reason=diff.xfail))
            yield pytest.param(case, door, id=f"{case.id}-{door}", marks=marks)


@pytest.fixture(scope="module")
def serve() -> Iterator[doors.Serve]:
    with doors.uvicorn_serving(doors.Dispatch()) as serving:
        yield serving


@pytest.mark.parametrize(("case", "door"), list(_params()))
async def test_conformance(case: Case, door: str, request: pytest.FixtureRequest) -> None:
    if door in SERVED:
        run = await DOORS[door](case, request.getfixturevalue("serve"), f"{case.id}-{door}")
    else:
        run = await DOORS[door](case)
    statuses, headers, charged = case.expected(door)
    names = NAMES.get(door)
    if names is not None:
        headers = doors.rename(headers, names(case))
    got_statuses = tuple(status for status, _ in run.answers)
    last = run.answers[-1][1]
    got_headers = {name: last.get(name) for name in headers}
    for name, value in headers.items():
        if value == ANY and got_headers[name] is not None:
            got_headers[name] = value
    assert (got_statuses, got_headers) == (statuses, headers)
    assert doors.charged(run.store, case) == dict(charged)
