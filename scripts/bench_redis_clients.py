"""Which Redis client runs ratewarden's check script fastest? redis-py (asyncio + hiredis) vs
valkey-glide, on the path RedisStore uses: 50 concurrent checks sent as one pipeline of EVALSHA
(and, for reference, 50 separate concurrent EVALSHA calls).

Starts its own redis-server on a free loopback port. Prints checks/s, median of ``--runs`` runs.

    .venv/bin/python scripts/bench_redis_clients.py [--runs 7] [--rounds 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.servers import RedisStandalone

from ratewarden.limits import make_limits
from ratewarden.stores.redis import SCRIPT, SCRIPT_SHA, RedisStore
from ratewarden.stores.redis.protocol import PackedCommands, ScriptArgs

CONCURRENCY = 50


def script_args(i: int) -> tuple[list[str], list[str]]:
    (limit,) = make_limits("1000000000/hour", "token_bucket")
    store_args = RedisStore._args_of.__get__(_STORE)(limit)  # type: ignore[attr-defined]
    return [f"rw:{{bench|{i % 1000}}}:{limit.suffix}"], ["h", "", *store_args, "1"]


_STORE = RedisStore("redis://127.0.0.1:1")


async def redis_py(url: str, rounds: int, pipelined: bool) -> float:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    await client.script_load(SCRIPT)
    calls = [script_args(i) for i in range(CONCURRENCY)]
    started = time.perf_counter()
    for _ in range(rounds):
        if pipelined:
            pipe = client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.execute_command("EVALSHA", SCRIPT_SHA, 1, *keys, *args)
            await pipe.execute()
        else:
            await asyncio.gather(*(client.execute_command("EVALSHA", SCRIPT_SHA, 1, *k, *a) for k, a in calls))
    elapsed = time.perf_counter() - started
    await client.aclose()
    return rounds * CONCURRENCY / elapsed


async def packed(url: str, rounds: int) -> float:
    """What RedisStore does now: pre-packed RESP written on one redis-py connection, replies read
    with hiredis (no Pipeline object, no per-argument encoding)."""
    store = RedisStore(url, timeout=5)
    (limit,) = make_limits("1000000000/hour", "token_bucket")
    commands = [PackedCommands(ScriptArgs(None)).request("h", [f"rw:{{bench|{i}}}:{limit.suffix}"], [limit], [1.0], b"$0\r\n\r\n") for i in range(CONCURRENCY)]
    await store._connections.execute(commands[:1])  # connects and loads the script
    started = time.perf_counter()
    for _ in range(rounds):
        await store._connections.execute(commands)
    elapsed = time.perf_counter() - started
    await store.close()
    return rounds * CONCURRENCY / elapsed


async def glide(port: int, rounds: int, pipelined: bool) -> float:
    from glide import Batch, GlideClient, GlideClientConfiguration, NodeAddress

    client = await GlideClient.create(GlideClientConfiguration([NodeAddress("127.0.0.1", port)]))
    await client.custom_command(["SCRIPT", "LOAD", SCRIPT])
    calls = [["EVALSHA", SCRIPT_SHA, "1", *keys, *args] for keys, args in (script_args(i) for i in range(CONCURRENCY))]
    started = time.perf_counter()
    for _ in range(rounds):
        if pipelined:
            batch = Batch(is_atomic=False)
            for call in calls:
                batch.custom_command(call)
            await client.exec(batch, raise_on_error=True)
        else:
            await asyncio.gather(*(client.custom_command(c) for c in calls))
    elapsed = time.perf_counter() - started
    await client.close()
    return rounds * CONCURRENCY / elapsed


async def store_path(url: str, rounds: int, coalesce: bool) -> float:
    """The whole RedisStore.hit path (argument building, coalescing, decoding)."""
    store = RedisStore(url, timeout=5, coalesce=coalesce, cache=False)
    (limit,) = make_limits("1000000000/hour", "token_bucket")
    keys = [[f"rw:{{bench|{i}}}:{limit.suffix}"] for i in range(CONCURRENCY)]
    await store.hit(keys[0], [limit], [1.0])
    started = time.perf_counter()
    for _ in range(rounds):
        await asyncio.gather(*(store.hit(k, [limit], [1.0]) for k in keys))
    elapsed = time.perf_counter() - started
    await store.close()
    return rounds * CONCURRENCY / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=200)
    opts = parser.parse_args()
    server = RedisStandalone().start()
    try:
        cases = {
            "redis-py  pipeline of 50 EVALSHA": lambda: redis_py(server.url, opts.rounds, True),
            "redis-py  50 concurrent EVALSHA": lambda: redis_py(server.url, opts.rounds, False),
            "redis-py connection, 50 pre-packed": lambda: packed(server.url, opts.rounds),
            "glide     batch of 50 EVALSHA": lambda: glide(server.port, opts.rounds, True),
            "glide     50 concurrent EVALSHA": lambda: glide(server.port, opts.rounds, False),
            "RedisStore.hit, coalesced": lambda: store_path(server.url, opts.rounds, True),
            "RedisStore.hit, not coalesced": lambda: store_path(server.url, opts.rounds, False),
        }
        results: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(opts.runs):
            for name, case in cases.items():  # interleaved, so drift hits every case alike
                cpu_before = time.process_time()
                rate = asyncio.run(case())
                # Process CPU (all threads: glide's Rust core runs on its own threads).
                cpu[name].append((time.process_time() - cpu_before) / (opts.rounds * CONCURRENCY + CONCURRENCY))
                results[name].append(rate)
        print(f"{'case':36} {'checks/s':>10} {'wall us/check':>14} {'CPU us/check':>13}"
              f"   (medians of {opts.runs} runs, {CONCURRENCY} concurrent)")
        for name, values in results.items():
            med = statistics.median(values)
            print(f"{name:36} {med:10,.0f} {1e6 / med:14.1f} {1e6 * statistics.median(cpu[name]):13.1f}")
    finally:
        server.close()


if __name__ == "__main__":
    main()
