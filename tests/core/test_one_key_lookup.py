"""One key lookup: every check finds the client's key with ``enforcement.core.key_of`` (and
``key_later`` for an awaitable answer), so the async check, its single-rule inline path, the
blocking check and shadow rules charge the same key for the same key function, failures included."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ratewarden import Limiter, MemoryStore, Rule
from ratewarden.enforcement.check import check_rules
from ratewarden.enforcement.core import KEY_ERROR_PREFIX, key_of, key_value
from ratewarden.enforcement.sync_check import check_blocking
from ratewarden.rules import CompiledRule
from tests.core.asgi import http_scope

SRC = Path(__file__).resolve().parents[2] / "src" / "ratewarden"
CLIENT = "203.0.113.7"

def test_only_the_shared_lookup_calls_a_key_function() -> None:
    calls = re.compile(r"\.key\(|\bkey\(scope\)")
    found = sorted(
        str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if calls.search(path.read_text(encoding="utf-8"))
    )
    assert found == ["enforcement/core.py"], found


async def _later() -> str:
    await asyncio.sleep(0)
    return "later"


def _raises(scope: Any) -> str:
    raise RuntimeError("key lookup failed")


KEYS: dict[str, tuple[Callable[[Any], Any], str, str]] = {
    # key function, the key the async checks charge, the key the blocking check charges
    "text": (lambda s: "user-1", "user-1", "user-1"),
    "none is the client": (lambda s: None, CLIENT, CLIENT),
    "empty is the client": (lambda s: "", CLIENT, CLIENT),
    "a number as text": (lambda s: 42, "42", "42"),
    "raises": (_raises, KEY_ERROR_PREFIX + CLIENT, KEY_ERROR_PREFIX + CLIENT),
    "awaitable": (lambda s: _later(), "later", KEY_ERROR_PREFIX + CLIENT),
}


def _charged(store: MemoryStore) -> set[str]:
    return {key.split("|", 1)[1].rsplit("}", 1)[0] for key in store._data}


@pytest.mark.parametrize("name", list(KEYS))
async def test_every_check_charges_the_key_key_of_finds(name: str) -> None:
    key, expected, blocking = KEYS[name]
    inline, several, sync = MemoryStore(), MemoryStore(), MemoryStore()
    for store, rules in (
        (inline, [Rule("/**", "5/min", key=key, name="r")]),
        (several, [Rule("/**", "5/min", key=key, name="r"), Rule("/**", "9/min", key=key, name="s")]),
    ):
        limiter = Limiter(store)
        compiled = tuple(CompiledRule(rule, limiter.prefix) for rule in rules)
        assert await check_rules(limiter, compiled, http_scope()) is not None
        assert _charged(store) == {expected}
    limiter = Limiter(sync)
    if name != "awaitable":
        assert key_of(limiter, CompiledRule(Rule("/**", "5/min", key=key), limiter.prefix), http_scope()) == expected
    assert check_blocking(limiter, (CompiledRule(Rule("/**", "5/min", key=key, name="r"), limiter.prefix),), http_scope())
    assert _charged(sync) == {blocking}


def test_key_value_is_the_text_and_leaves_failures_to_the_caller() -> None:
    assert key_value(lambda s: None, http_scope()) == CLIENT
    assert key_value(lambda s: 7, http_scope()) == "7"
    with pytest.raises(RuntimeError, match="key lookup failed"):
        key_value(_raises, http_scope())
    rule = CompiledRule(Rule("/**", "5/min", key=_raises), "rw")
    with pytest.raises(RuntimeError):
        key_of(None, rule, http_scope())  # no limiter: a shadow rule's caller logs the failure
