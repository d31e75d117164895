"""SharedMemoryStore regressions: a corrupt index fails the check (bounded, a clear error, the
limiter's ``on_error``) instead of spinning; a reopen after ``unlink()`` maps the new file; names
are validated strictly; a directory at the path is a clear error; a check never moves an entry's
expiry earlier (a caller whose clock reads slightly late)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ratewarden import Limiter
from ratewarden.limits import Limit
from ratewarden.rates import Rate
from ratewarden.stores import SharedMemoryStore
from ratewarden.stores.base import StoreError
from ratewarden.stores.memory import MemoryStore
from ratewarden.stores.shared_memory import SharedMemoryError, segment_path
from ratewarden.stores.shared_memory.layout import BODY_HEAD, E_BODY
from ratewarden.stores.shared_memory.table import entry, find
from tests.shm import unique_name

ROOT = Path(__file__).resolve().parents[2]
def _bounded(fn: Callable[[], object], seconds: float = 10.0) -> object:
    """``fn()``'s result or exception, or a failure if it has not returned in ``seconds`` (the thread
    that spins is left behind: a daemon)."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"no answer within {seconds} s: a probe loop does not end"
    return out[0]


def _index_span(store: SharedMemoryStore) -> tuple[int, int]:
    region = store._segment().regions[0]
    return region.index, region.entries


# --- 1. a corrupt index ------------------------------------------------------------------------


@pytest.mark.parametrize("garbage", ["random", "all-ones"])
def test_corrupt_index_slots_raise_a_clear_error_in_bounded_time(
    tmp_path: Path, lock: str, garbage: str
) -> None:
    """Every index slot non-empty (random garbage, or all pointing at entry 0): a probe for a key
    not there used to loop for ever; now the check raises ``SharedMemoryError`` at once."""
    name = unique_name()
    store = SharedMemoryStore(name, max_keys=100, directory=tmp_path, lock=lock)
    limit = Limit(Rate(5, 60.0))
    assert store.hit_now(["present"], [limit], [1.0]).allowed
    start, end = _index_span(store)
    path = segment_path(name, tmp_path)
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(os.urandom(end - start) if garbage == "random" else b"\x01\x00\x00\x00" * ((end - start) // 4))
    for key in ("absent", "other", "present"):
        got = _bounded(lambda key=key: store.hit_now([key], [limit], [1.0]))  # type: ignore[misc]
        if garbage == "all-ones" and key == "present" and not isinstance(got, BaseException):
            continue  # the slot of entry 0 is on every probe: the key is found
        assert isinstance(got, SharedMemoryError), got
        assert isinstance(got, StoreError)
        assert str(path) in str(got) and "corrupt" in str(got), got
    for op in (
        lambda: store.hit_now(["a", "b"], [limit, limit], [1.0, 1.0]),
        lambda: store.peek_now(["absent"], [limit]),
        lambda: store.adjust_now(["absent"], [limit], [1.0]),
        lambda: store.reset_now(["absent"]),
        lambda: store.state_of("absent"),
    ):
        got = _bounded(op)
        assert isinstance(got, SharedMemoryError) and "corrupt" in str(got), got


def test_corrupt_table_fails_the_check_per_on_error(tmp_path: Path) -> None:
    """Through the limiter, the corrupt table is a store failure (``StoreError``), so a check follows
    ``on_error``: ``"closed"`` raises (503), ``"open"`` decides on an insurance limiter; neither hangs."""
    name = unique_name()
    store = SharedMemoryStore(name, max_keys=100, directory=tmp_path)
    start, end = _index_span(store)
    with open(segment_path(name, tmp_path), "r+b") as f:
        f.seek(start)
        f.write(b"\xff" * (end - start))
    closed = Limiter(store, on_error="closed", fallback=None)
    got = _bounded(lambda: closed.hit_sync("client", "5/min"))
    assert isinstance(got, SharedMemoryError), got
    opened = Limiter(store, on_error="open", fallback=MemoryStore())
    decision = _bounded(lambda: opened.hit_sync("client", "5/min"))
    assert not isinstance(decision, BaseException), decision
    assert decision.allowed  # type: ignore[attr-defined]
    assert opened.without_store()["error"] == 1


def test_corrupt_count_is_a_clear_error(tmp_path: Path) -> None:
    """A region count beyond the region's capacity is reported, not followed out of the region."""
    name = unique_name()
    store = SharedMemoryStore(name, max_keys=100, directory=tmp_path, lock="lockf")
    limit = Limit(Rate(5, 60.0))
    store.hit_now(["a"], [limit], [1.0])
    base = store._segment().regions[0].base
    with open(segment_path(name, tmp_path), "r+b") as f:
        f.seek(base)
        f.write((10**6).to_bytes(4, "little"))
    got = _bounded(lambda: store.hit_now(["new"], [limit], [1.0]))
    assert isinstance(got, SharedMemoryError) and "corrupt" in str(got), got


# --- 2. a reopen after unlink -------------------------------------------------------------------


def test_reopen_after_unlink_shares_the_new_file_with_other_processes(tmp_path: Path) -> None:
    """After ``unlink()``, a store opened on the name again in this process maps the new file, the
    one another process opens: together they admit the limit once (they admitted 6 against 3)."""
    name = unique_name()
    limit = Limit(Rate(3, 60.0))
    old = SharedMemoryStore(name, max_keys=100, directory=tmp_path)
    assert old.hit_now(["k"], [limit], [1.0]).allowed
    old.unlink()
    again = SharedMemoryStore(name, max_keys=100, directory=tmp_path)
    assert os.fstat(again._segment().fd).st_ino == segment_path(name, tmp_path).stat().st_ino
    code = (
        "from ratewarden.limits import Limit; from ratewarden.rates import Rate\n"
        "from ratewarden.stores import SharedMemoryStore\n"
        f"s = SharedMemoryStore({name!r}, max_keys=100, directory={str(tmp_path)!r})\n"
        "print(sum(s.hit_now(['k'], [Limit(Rate(3, 60.0))], [1.0]).allowed for _ in range(3)))\n"
    )
    mine = sum(again.hit_now(["k"], [limit], [1.0]).allowed for _ in range(2))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), *sys.path])))
    assert done.returncode == 0, done.stderr
    assert mine == 2 and int(done.stdout) == 1, (mine, done.stdout)
    assert old.hit_now(["k"], [limit], [1.0]).allowed  # an open store keeps the old table
    assert not again.hit_now(["k"], [limit], [1.0]).allowed


async def test_closing_the_last_store_of_an_unlinked_file_unmaps_it(tmp_path: Path) -> None:
    """The old mapping, no longer the one new stores get, is still closed with its last user."""
    name = unique_name()
    old = SharedMemoryStore(name, max_keys=100, directory=tmp_path)
    seg = old._segment()
    old.unlink()
    again = SharedMemoryStore(name, max_keys=100, directory=tmp_path)
    assert again._segment() is not seg
    await old.close()
    assert seg.mm.closed
    await again.close()


# --- 3. and 4. names and paths -----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a\n", "a\r", "\na", "a\x00", "ä", "a b"])
def test_names_are_validated_strictly(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="letters, digits") as info:
        SharedMemoryStore(bad, directory=tmp_path)
    assert repr(bad) in str(info.value)
    assert not list(tmp_path.iterdir())


def test_a_directory_at_the_path_is_a_clear_error(tmp_path: Path) -> None:
    name = unique_name()
    path = segment_path(name, tmp_path)
    path.mkdir()
    with pytest.raises(SharedMemoryError, match="is a directory") as info:
        SharedMemoryStore(name, directory=tmp_path)
    assert str(path) in str(info.value)


def test_an_unusable_directory_is_a_clear_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        target = tmp_path / "file"
        target.write_bytes(b"")
        directory = target  # not a directory: creating the table in it fails whoever we are
    else:
        directory = tmp_path / "ro"
        directory.mkdir(mode=0o500)
    with pytest.raises(SharedMemoryError, match="cannot create") as info:
        SharedMemoryStore(unique_name(), directory=directory)
    assert str(directory) in str(info.value)


# --- 5. a check never moves an expiry earlier -------------------------------------------------


def _expiry(store: SharedMemoryStore, key: str) -> float:
    seg = store._segment()
    slot = store._slot(seg, key)
    pos = find(seg, slot.region, slot.digest, slot.home)
    assert pos >= 0
    return float(BODY_HEAD.unpack_from(seg.mm, entry(seg, slot.region, pos) + E_BODY)[0])


@pytest.mark.parametrize("keys", [1, 2])
def test_a_late_clock_never_moves_an_expiry_earlier(tmp_path: Path, lock: str, keys: int) -> None:
    """A check at 1001.001 (window 1001 of 100/s, expiry 1002) then one whose clock reads
    1000.9995: the entry's expiry stays 1002, so the newer window's count outlives the late
    caller's idea of it, 1000.9995 + 1 (one key: the inlined and C hot paths; two: the general
    path)."""
    now = [1001.001]
    store = SharedMemoryStore(unique_name(), max_keys=100, directory=tmp_path, lock=lock, clock=lambda: now[0])
    limit = Limit(Rate(100, 1.0))
    names = [f"k{i}" for i in range(keys)]
    assert store.hit_now(names, [limit] * keys, [1.0] * keys).allowed
    assert [_expiry(store, k) for k in names] == [1002.0] * keys
    now[0] = 1000.9995
    store.hit_now(names, [limit] * keys, [1.0] * keys)
    assert [_expiry(store, k) for k in names] == [1002.0] * keys
    now[0] = 1001.5  # the clock back in window 1001: its count goes on, the expiry unchanged
    store.hit_now(names, [limit] * keys, [1.0] * keys)
    assert [_expiry(store, k) for k in names] == [1002.0] * keys
    now[0] = 1001.9998  # after the late caller's now + reset_after: window 1001's count is still there
    assert store.hit_now(names, [limit] * keys, [1.0] * keys).remaining == 96


def test_a_refund_keeps_its_own_expiry(tmp_path: Path) -> None:
    """``adjust`` is unchanged: a refund that hands a whole window back deletes the key."""
    now = [1001.001]
    store = SharedMemoryStore(unique_name(), max_keys=100, directory=tmp_path, clock=lambda: now[0])
    limit = Limit(Rate(100, 1.0))
    store.hit_now(["k"], [limit], [1.0])
    store.adjust_now(["k"], [limit], [-1.0])
    assert store.state_of("k") is None



@pytest.mark.parametrize("lock", ["lockf", "mutex"])
def test_a_corrupt_state_length_is_a_clear_error(tmp_path: Path, lock: str) -> None:
    """An entry whose state length cannot be true is reported as corruption on the inlined one-key
    path too (it raised a bare IndexError: a 500 rather than the failure policy)."""
    from ratewarden.stores.shared_memory.layout import BODY_HEAD, E_BODY

    name = unique_name()
    store = SharedMemoryStore(name, max_keys=100, directory=tmp_path, lock=lock)
    limit = Limit(Rate(5, 60.0))
    store.hit_now(["a"], [limit], [1.0])
    region = store._segment().regions[store._locate(store._segment(), "a")[2].number]
    off = region.entries  # the region's first entry: "a", its only key
    with open(segment_path(name, tmp_path), "r+b") as f:
        f.seek(off + E_BODY + BODY_HEAD.size - 4)
        f.write((10**6).to_bytes(4, "little"))
    got = _bounded(lambda: store.hit_now(["a"], [limit], [1.0]))
    assert isinstance(got, SharedMemoryError) and "corrupt" in str(got), got
