"""The core's registry of limits declared on routes (``ratewarden.route_limits``): what every
framework door declares its per-route limits with."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from ratewarden.keys import header
from ratewarden.limits import Limit
from ratewarden.rates import parse_rates
from ratewarden.route_limits import Declared, RouteLimits, counted
from ratewarden.storage_keys import storage_key

SRC = Path(__file__).resolve().parents[2] / "src" / "ratewarden"


def handler() -> str:
    return "ok"


def test_no_door_builds_a_route_rule_of_its_own() -> None:
    builders = sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if re.search(r"""Rule\(\s*["']/\*\*["']""", path.read_text()) and "bench" not in path.parts
    )
    assert builders == ["route_limits.py"]


def test_limits_on_a_wrapper_and_on_the_function_it_wraps_all_apply_outermost_first() -> None:
    routes: RouteLimits[Declared] = RouteLimits(prefix="p")

    def inner() -> str:
        return "ok"

    @functools.wraps(inner)
    def outer() -> str:
        return inner()

    routes.add(inner, Declared("1/min"))
    routes.add(outer, Declared("2/min"))
    routes.add(outer, Declared("3/min"))  # a decorator above the one before: first in source order
    rules = routes.rules("orders", outer)
    assert [(r.name, r.rate) for r in rules] == [
        ("orders", "3/min"), ("orders-1", "2/min"), ("orders-2", "1/min"),
    ]
    assert [r.name for r in routes.rules("orders", inner)] == ["orders"]


def test_a_call_declares_after_the_limits_before_it() -> None:
    routes: RouteLimits[Declared] = RouteLimits()
    group = object()  # a blueprint: limits declared by calls, in source order
    first, second = Declared("1/min"), Declared("2/min")
    routes.add(group, first, stacked=False)
    routes.add(group, second, stacked=False)
    assert routes.on(group) == ([first, second], False)


def test_exempt_reaches_through_wrappers_and_every_declaration_moves_the_generation() -> None:
    routes: RouteLimits[Declared] = RouteLimits()

    @functools.wraps(handler)
    def wrapper() -> str:
        return handler()

    assert routes.on(wrapper) == ([], False)
    routes.exempt_target(handler)
    assert routes.on(wrapper) == ([], True) and routes.generation == 1
    assert routes.of("r", handler) is None
    routes.add(handler, Declared("1/min"))
    assert routes.generation == 2
    built = routes.of("r", handler)  # rebuilt after the declaration, then kept
    assert built is not None and routes.of("r", handler) is built


def test_an_unhashable_handler_has_no_limits_of_its_own_but_those_it_wraps() -> None:
    class View:
        __hash__ = None  # type: ignore[assignment]

        def __init__(self, wrapped: Any) -> None:
            self.__wrapped__ = wrapped

        def __call__(self) -> str:
            return "ok"

    routes: RouteLimits[Declared] = RouteLimits()
    limit = Declared("1/min")
    routes.add(handler, limit)
    assert routes.on(View(None)) == ([], False)
    assert routes.on(View(handler)) == ([limit], False)


def test_a_limit_with_a_name_of_its_own_keeps_it_wherever_it_is_declared() -> None:
    shared, own = Declared("1/min", name="pool"), Declared("2/min")
    assert counted("orders", [shared, own]) == [(shared, "pool"), (own, "orders-1")]
    assert counted("items", [own, shared]) == [(own, "items"), (shared, "pool")]


def test_methods_are_checked_when_declared_and_get_brings_head() -> None:
    limit = Declared("1/min", methods="get")
    assert [m for m in ("GET", "HEAD", "POST") if limit.applies_to(m)] == ["GET", "HEAD"]
    assert Declared("1/min").applies_to("PATCH")


def test_compiled_counts_under_the_route_name_with_the_doors_defaults() -> None:
    key = header("X-Key")
    unnamed = Declared("10/min").compiled("orders", "pfx", key, "sliding_window", label="")
    suffix = Limit(parse_rates("10/min")[0], "sliding_window").suffix
    assert unnamed.storage_keys("k1") == (storage_key("pfx", "orders", "k1", suffix),)
    assert unnamed.rule.key is key and unnamed.policy == b'"10/min";q=10;w=60'  # the rate as written
    named = Declared("10/min", name="pool").compiled("orders", "pfx", label="")
    assert named.rule.name == "pool" and named.policy == b'"pool";q=10;w=60'
