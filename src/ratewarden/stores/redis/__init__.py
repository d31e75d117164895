"""Redis / Valkey store: every check is one server-side Lua script, coalesced into pipelines.

* One ``EVALSHA`` per check evaluates all its limits (any mix of the seven algorithms) all or
  nothing, on the server clock (``TIME``), and returns the deciding limit's full decision, so
  headers need no second call; a pipeline's single-key checks share one call (``batching``). The
  script is loaded on connect; a later ``NOSCRIPT`` loads it again (``EVAL`` where an ACL refuses
  ``SCRIPT LOAD``).
* Checks started in the same event-loop tick go out as one pipeline (``coalesce``); at most
  ``pool_size`` pipelines are in flight, later checks queue into the next one.
* Rejections are remembered locally until their retry time (``cache``): a key known to be over
  its limit is answered without a round trip. Only denials are cached, so it never allows
  anything the server would deny.
* A check fails when the store stays silent for ``timeout``: time our own busy event loop or
  queue holds it does not count, nor does a reply that has arrived and waits to be read (see
  ``pipeline``); failures raise ``StoreError`` naming the URL. Each script carries the moment
  its caller may stop waiting (on the server clock): a script that only runs after that, e.g.
  once a paused server resumes, charges nothing, so a check answered as failed is never charged.
* Redis Cluster: keys of one (scope, client key) share a hash tag, so such a check is one
  script on one slot. A check whose keys span slots (rules keyed on different identities)
  first peeks every slot and charges only when all allow; see docs/stores.md.

Where each part lives:

=================  ==========================================================================
``store``          ``RedisStore``: check, peek, adjust, reset, clear; the rejection cache
``protocol``       the script, its arguments, hand-packed RESP commands, reply decoding
``pipeline``       coalescing into pipelines: batches, slots, timers judged by what arrived
``connections``    sending a pipeline: our own connections (standalone, Sentinel) or Cluster's
``batching``       a pipeline's single-key checks folded into one script call (standalone, Sentinel)
``clock``          the scripts' deadline on the server clock
``topology``       the client for standalone / Sentinel / Cluster; Cluster hash slots
``client``         the one place relying on redis-py internals (each one listed and tested)
``errors``         client failures as ``StoreError``
``_redis``         what is taken from redis-py, imported once (the one "pip install" error)
=================  ==========================================================================
"""

from __future__ import annotations

from .protocol import ALGORITHM_IDS, SCRIPT, SCRIPT_SHA
from .store import RedisStore

__all__ = ["ALGORITHM_IDS", "SCRIPT", "SCRIPT_SHA", "RedisStore"]
