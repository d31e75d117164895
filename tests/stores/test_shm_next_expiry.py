"""The region's ``next_expiry`` is a lower bound of its entries' expiries (``table.write``), on the
one-key check's own write too (its inlined copy in ``slots.charge_one``, and the C helpers'
``commit``), so a full region whose keys have expired is swept rather than sent to the overflow.

In normal operation that write cannot lower the bound (it never moves an expiry earlier, so the
new expiry is at least the entry's own, itself at least the bound): these tests break the bound
by hand to see that the one-key check restores it as ``table.write`` does (issue 22).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores import SharedMemoryStore
from ratewarden.stores.shared_memory.layout import E_BODY, F64, R_NEXT_EXPIRY
from ratewarden.stores.shared_memory.table import FIELDS, entry, find
from tests.shm import unique_name

NATIVE = importlib.util.find_spec("ratewarden.stores.shared_memory._native") is not None
KINDS = ["mutex", "lockf"] if sys.platform.startswith("linux") else ["lockf"]
if NATIVE:
    KINDS.insert(1, "mutex-ctypes")


def _store(tmp_path: Path, kind: str, now: list[float], monkeypatch: pytest.MonkeyPatch) -> SharedMemoryStore:
    if kind == "mutex-ctypes":
        monkeypatch.setenv("RATEWARDEN_SHM_NATIVE", "0")
    lock = "mutex" if kind.startswith("mutex") else "lockf"
    store = SharedMemoryStore(unique_name(), max_keys=2, directory=tmp_path, clock=lambda: now[0], lock=lock)
    assert (store._segment().native is not None) == (NATIVE and kind == "mutex")
    return store


@pytest.mark.parametrize("kind", KINDS)
def test_a_one_key_check_keeps_next_expiry_a_bound(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    store = _store(tmp_path, kind, now, monkeypatch)
    limit = Limit(Rate(5, 60.0), "fixed_window")
    store.hit_now(["a"], [limit], [1.0])  # inserted: the general path
    seg = store._segment()
    digest, home, region = store._where["a"]
    FIELDS.f64(seg.mm, region.base + R_NEXT_EXPIRY, math.inf)  # a bound that no longer holds
    now[0] = 1001.0
    assert store.hit_now(["a"], [limit], [1.0]).remaining == 3  # the one-key check's own write
    off = entry(seg, region, find(seg, region, digest, home))
    expires = F64.unpack_from(seg.mm, off + E_BODY)[0]
    assert F64.unpack_from(seg.mm, region.base + R_NEXT_EXPIRY)[0] <= expires


@pytest.mark.parametrize("kind", KINDS)
def test_a_full_region_of_expired_keys_is_swept_after_a_one_key_write(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    store = _store(tmp_path, kind, now, monkeypatch)
    limit = Limit(Rate(5, 60.0), "fixed_window")
    store.hit_now(["a"], [limit], [1.0])
    store.hit_now(["b"], [limit], [1.0])  # the region (the whole table: max_keys=2) is full
    seg = store._segment()
    region = store._where["a"][2]
    FIELDS.f64(seg.mm, region.base + R_NEXT_EXPIRY, math.inf)
    store.hit_now(["a"], [limit], [1.0])  # the one-key check's write lowers the bound again
    now[0] = 1000.0 + 3600.0  # both keys expired
    assert store.hit_now(["c"], [limit], [1.0]).remaining == 4
    assert store.overflowed == 0  # swept: "c" has its own entry, not the overflow allowance
    assert len(store) == 1
