"""Memcached store: the pure algorithms run here, state is swapped in with ``gets``/``cas``.

A check decides in this process and writes with compare and swap: a lost race re-reads and
retries. Memcached has no clock command: time is this host's ``time.time()``. Hosts sharing a
memcached must keep their clocks in sync (NTP); a skew of ``s`` seconds shifts windows by ``s``.

Where each part lives:

===============  ============================================================================
``store``        ``MemcachedStore``: settings, check, peek, adjust, reset, clear, close
``batches``      single-key checks coalesced per key: one read and one write per batch
``cas``          the compare-and-swap loops: multi-key checks, ``adjust``, backoff
``putbacks``     writes, and putting back what a check that did not complete wrote
``locks``        this process's per-key locks
``commands``     a command sent and its reply timed by what memcached sends (``timeout``)
``connections``  the pool: connecting bounded, arrivals counted per connection
``queues``       the checks waiting for their key's next batch
``protocol``     the text protocol: commands and the readers of their replies
``encoding``     keys, states and expiry times as memcached takes them
``_aiomcache``   what is taken from aiomcache, imported once (the one "pip install" error)
===============  ============================================================================
"""

from __future__ import annotations

from .encoding import THIRTY_DAYS as THIRTY_DAYS
from .encoding import expiry as expiry
from .encoding import memcached_key
from .store import MemcachedStore

__all__ = ["MemcachedStore", "memcached_key"]
