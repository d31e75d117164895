"""Redis's own CPU per call of the check script: two versions compared (A/B), or one broken into
its parts beside envoyproxy/ratelimit's commands (``--parts``).

One private redis-server. Each variant sends ``--calls`` calls of one fixed window under its limit
(1e9/hour, the gateway bench's ``under`` row) in pipelines of 50; rounds alternate between the
variants (order flipped every round), reading redis-server's user + system time from ``/proc``
around each. The client's time does not count: this is the server's cost per decision, the figure
the gateway bench sets beside envoyproxy/ratelimit's ``INCRBY`` + ``EXPIRE``.

    .venv/bin/python scripts/bench_redis_script.py OLD.lua src/ratewarden/stores/lua/check.lua
    (OLD.lua, e.g.: git show HEAD~1:src/ratewarden/stores/lua/check.lua > /tmp/old.lua)
    .venv/bin/python scripts/bench_redis_script.py --parts src/ratewarden/stores/lua/check.lua

``--parts`` runs, beside the script: envoyproxy/ratelimit's ``INCRBY`` + ``EXPIRE`` (no script);
the least any script on the server's clock costs (``TIME``, ``INCRBY``, ``PEXPIRE``, one argument,
an integer reply); the script's first lines alone with its ten arguments (the clock read and the
deadline check); the same plus its ``GET`` and ``PSETEX``; the script with an integer reply; and
the store's folded call (``stores/redis/batching.py``: the script run for 10, and for 50, checks
in one call). Each step's difference is what that part of a call costs Redis.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from ratewarden.bench.services import free_port, redis_server
from ratewarden.stores.redis.batching import BATCH_SCRIPT

_ARGS = ("h", "", "1", "1000000000", "3600", "1000000000", "0", "1")  # "" is the deadline, set at run time
_HEAD = """local clock = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
if clock and now > -clock then return redis.error_reply('expired') end
"""
_LEAST = "redis.call('TIME') local n = redis.call('INCRBY', KEYS[1], ARGV[1]) " \
         "if n == tonumber(ARGV[1]) then redis.call('PEXPIRE', KEYS[1], 3600000) end return n"

Send = Callable[[Any, str], None]


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _integer_reply(script: str) -> str:
    """``script`` whose fast path's allowed reply is ``1`` (its decision's table and float text left out)."""
    start = script.index("      return {1, limit")
    end = script.index("\n", start)
    return script[:start] + "      return 1" + script[end:]


def _variants(client: redis.Redis, args: argparse.Namespace, deadline: str) -> dict[str, Send]:
    """What each variant sends for one call, by name, its scripts loaded."""
    argv = (_ARGS[0], deadline, *_ARGS[2:])

    def script(source: str) -> Send:
        sha = client.script_load(source)
        return lambda pipe, key: pipe.evalsha(sha, 1, key, *argv)

    if not args.parts:
        return {"A": script(args.a.read_text()), "B": script(args.b.read_text())}
    source = args.a.read_text()
    least = client.script_load(_LEAST)
    batch = client.script_load(BATCH_SCRIPT)

    def batched(size: int) -> Send:
        def send(pipe: Any, key: str) -> None:
            sent = getattr(pipe, "rw_batched", 0)
            pipe.rw_batched = sent + 1
            if sent % size == 0:  # the pipeline's 50 calls as 50 / size script calls of size checks
                pipe.evalsha(batch, size, *(f"{key}-{i}" for i in range(size)), *(argv * size))

        return send

    def reference(pipe: Any, key: str) -> None:
        pipe.incrby(key, 1)
        pipe.expire(key, 3600)

    return {
        "envoyproxy/ratelimit: INCRBY + EXPIRE": reference,
        "least script: TIME, INCRBY, PEXPIRE": lambda pipe, key: pipe.evalsha(least, 1, key, "1"),
        "script's head, 10 arguments": script(_HEAD + "return 1"),
        "head + GET + PSETEX": script(_HEAD + "redis.call('GET', KEYS[1]) "
                                      "redis.call('PSETEX', KEYS[1], 1000, '1 2') return 1"),
        "the script, integer reply": script(_integer_reply(source)),
        f"the script ({args.a})": script(source),
        "folded: 10 checks a call (batching.py)": batched(10),
        "folded: 50 checks a call": batched(50),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path, nargs="?")
    parser.add_argument("--parts", action="store_true", help="break script A's cost into its parts")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
    if (args.b is None) != args.parts:
        parser.error("give two scripts to compare, or one with --parts")
    port = free_port()
    server = subprocess.Popen([redis_server(), "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        deadline = str(-(time.time() + 1e6))  # the server clock, with a deadline far ahead
        variants = _variants(client, args, deadline)
        per_call: dict[str, list[float]] = {name: [] for name in variants}
        for r in range(args.rounds):
            for index, (name, send) in enumerate(variants.items() if r % 2 == 0 else reversed(variants.items())):
                key = f"key-{r}-{index}"
                before = _cpu(server.pid)
                for _ in range(args.calls // 50):
                    pipe = client.pipeline(transaction=False)
                    for _ in range(50):
                        send(pipe, key)
                    replies = pipe.execute()
                per_call[name].append(1e6 * (_cpu(server.pid) - before) / args.calls)
                last = replies[-1]
                if isinstance(last, list) and isinstance(last[0], list):  # a folded call: its last check
                    last = last[-1]
                assert last not in (0, None) and (not isinstance(last, list) or last[0] == 1), last  # allowed
        width = max(map(len, per_call))
        for name, xs in per_call.items():
            print(f"{name:{width}}  Redis CPU per call {statistics.median(xs):.2f} µs median, {min(xs):.2f} min "
                  f"({', '.join(f'{x:.2f}' for x in xs)})")
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
