"""Outage seeds survive a flood of other keys (issue 36, item 4).

A remote store's ledger (``stores/insurance.py``) remembers its last answer per key so that the
insurance limiter starts an outage from what was left. The table is bounded; a flood of other
keys must not wipe a key's seed: a key checked again within its window outlives any number of keys
checked once, and a seed evicted while its window still runs leaves a mark, so its key is assumed
at its limit until that window ends, never as unused.
"""

from __future__ import annotations

import asyncio
import sys
import time
import tracemalloc
import uuid

from ratewarden import Limiter
from ratewarden.decision import Decision
from ratewarden.limits import make_limits
from ratewarden.stores.insurance import ANSWERS, ENTRY_BYTES, KEY_BYTES, MARK_BYTES, Ledger
from ratewarden.stores.memcached import MemcachedStore
from ratewarden.stores.redis import RedisStore
from tests.servers import Memcached, RedisStandalone

LIMIT = 50
RATE = f"{LIMIT}/hour"
USED = 45  # of the key's limit, before the flood
FLOOD = 16_400  # other keys checked once each: more than the ledger holds
DURING = 60  # checks of the key while the store is paused

(HOURLY,) = make_limits(RATE)


def answer(remaining: int, reset_after: float = 3600.0) -> Decision:
    """The store's answer for a key of ``LIMIT`` per hour with ``remaining`` left."""
    return Decision(True, LIMIT, remaining, reset_after, 0.0)


def key(name: str | int) -> str:
    return f"rw:{{|{name}}}:{HOURLY.suffix}"


def flood(ledger: Ledger, count: int, reset_after: float = 3600.0, every: int = 0, again: str = "") -> None:
    """``count`` other keys answered once each (their window running ``reset_after``); every
    ``every`` of them, ``again`` answered too."""
    for i in range(count):
        ledger.note(key(f"other{i}"), answer(LIMIT - 1, reset_after))
        if every and i % every == 0:
            ledger.note(again, answer(LIMIT - USED))


# -- the ledger alone --------------------------------------------------------------------------


def test_a_key_checked_twice_keeps_its_seed_through_a_flood_of_other_keys() -> None:
    ledger = Ledger()
    victim = key("victim")
    for used in range(1, USED + 1):
        ledger.note(victim, answer(LIMIT - used))
    flood(ledger, 2 * ANSWERS)
    assert len(ledger.answers) <= ANSWERS
    assert ledger.last_remaining(victim, time.monotonic()) == LIMIT - USED


def test_a_key_checked_during_the_flood_keeps_its_seed() -> None:
    """Checked once before the flood, then now and then while it runs: the least recently checked go first."""
    ledger = Ledger()
    victim = key("victim")
    ledger.note(victim, answer(LIMIT - 1))
    flood(ledger, 3 * ANSWERS, every=ANSWERS // 2, again=victim)
    assert len(ledger.answers) <= ANSWERS
    assert ledger.last_remaining(victim, time.monotonic()) == LIMIT - USED


def test_a_live_seed_pushed_out_leaves_at_most_what_it_had_until_its_window_ends() -> None:
    """Checked, then a flood: the seed is gone but its key starts the outage with at most what it
    had left (the least of the seeds pushed out into its slot), never the whole limit; once the
    seeds' windows have ended, with the whole limit again."""
    ledger = Ledger()
    victim = key("victim")
    ledger.note(victim, answer(LIMIT - 3, reset_after=5.0))  # answered once: in probation
    flood(ledger, ANSWERS + 1, reset_after=5.0)
    now = time.monotonic()
    assert ledger.answers.marked > 0
    assert ledger.last_remaining(victim, now) == LIMIT - 3
    assert ledger.last_remaining(victim, now + 5.1) is None


def test_a_key_sharing_a_marked_slot_gets_the_least_left_there() -> None:
    """A newcomer hashed to a slot where seeds were pushed out starts an outage with the least they
    had left (a flood of keys checked once: one less than the limit), not with nothing."""
    ledger = Ledger()
    flood(ledger, 4 * ANSWERS)
    now = time.monotonic()
    seen = {ledger.last_remaining(key(f"newcomer{i}"), now) for i in range(2000)}
    assert seen <= {None, LIMIT - 1} and LIMIT - 1 in seen


def test_seeds_whose_window_has_ended_leave_no_mark() -> None:
    """A flood of keys whose windows are over evicts without marks: other keys still start an
    outage from the whole limit."""
    ledger = Ledger()
    flood(ledger, 2 * ANSWERS, reset_after=0.0)
    assert len(ledger.answers) <= ANSWERS
    assert ledger.answers.marked == 0
    assert ledger.last_remaining(key("newcomer"), time.monotonic()) is None


def test_a_seed_too_large_to_keep_is_marked() -> None:
    """A storage key over the entry's bytes (non-ASCII text is 4 bytes a character) is not kept:
    its mark starts its key's outage from what it had left, not from the whole limit."""
    ledger = Ledger()
    huge = "rw:{|" + "\U0001f600" * 200 + "}:" + HOURLY.suffix
    assert sys.getsizeof(huge) > ENTRY_BYTES
    ledger.note(huge, answer(LIMIT - 1))
    assert len(ledger.answers) == 0
    assert ledger.last_remaining(huge, time.monotonic()) == LIMIT - 1


def test_forgetting_every_key_drops_the_marks_too() -> None:
    ledger = Ledger()
    victim = key("victim")
    ledger.note(victim, answer(LIMIT - 1))
    flood(ledger, ANSWERS + 1)
    assert ledger.answers.marked > 0
    ledger.forget()
    assert len(ledger.answers) == 0 and ledger.answers.marked == 0
    assert ledger.last_remaining(victim, time.monotonic()) is None


def test_the_last_answers_stay_within_their_bytes() -> None:
    """Twice the bound of the longest keys kept, all live: 512 B of key and answer each, plus the
    maps' own ~100 B an entry, plus the marks' fixed array (docs/security.md, "What a worker holds")."""
    ledger = Ledger()
    answers = ledger.answers
    now = time.monotonic()
    width = KEY_BYTES - sys.getsizeof("")
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for i in range(2 * ANSWERS):
            answers.note(f"{i:0{width}d}", LIMIT - 1, now + 3600.0, now)
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert len(answers) == ANSWERS and answers.marked == ANSWERS
    assert answers.mark_bytes() == MARK_BYTES
    assert held <= ANSWERS * (ENTRY_BYTES + 128) + MARK_BYTES, f"{held / 2**20:.2f} MiB"


# -- the reproduction, on a real server --------------------------------------------------------


async def flood_then_outage(limiter: Limiter, server: RedisStandalone | Memcached) -> int:
    """45 of 50/hour used on one key, 16,400 other keys checked, the store paused, 60 more checks
    of the key: how many were admitted in all."""
    try:
        before = [(await limiter.hit("victim", RATE)).allowed for _ in range(USED)]
        assert before == [True] * USED
        for start in range(0, FLOOD, 200):
            others = [limiter.hit(f"other{i}", RATE) for i in range(start, min(start + 200, FLOOD))]
            assert all(decision.allowed for decision in await asyncio.gather(*others))
        with server.server.paused():
            during = [(await limiter.hit("victim", RATE)).allowed for _ in range(DURING)]
        assert limiter.without_store()["local_limiter"] >= DURING
    finally:
        server.server.resume()
        await limiter.close()
    return USED + during.count(True)


async def test_a_flood_before_a_redis_outage_does_not_grant_the_limit_again(redis_standalone: RedisStandalone) -> None:
    """With the seeds wiped by the flood: 95 admitted against 50."""
    limiter = Limiter(RedisStore(redis_standalone.url, timeout=0.025), prefix=f"s{uuid.uuid4().hex[:10]}", workers=1)
    admitted = await flood_then_outage(limiter, redis_standalone)
    assert admitted <= LIMIT * 1.02, f"admitted {admitted} against {LIMIT}"
    assert admitted == LIMIT


async def test_a_flood_before_a_memcached_outage_does_not_grant_the_limit_again(memcached_server: Memcached) -> None:
    """With the seeds wiped by the flood: 95 admitted against 50."""
    limiter = Limiter(MemcachedStore(memcached_server.url, timeout=0.05), prefix=f"s{uuid.uuid4().hex[:10]}", workers=1)
    admitted = await flood_then_outage(limiter, memcached_server)
    assert admitted <= LIMIT * 1.02, f"admitted {admitted} against {LIMIT}"
    assert admitted == LIMIT
