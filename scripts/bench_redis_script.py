"""Redis's own CPU per call of the check script, two versions compared (A/B).

One private redis-server; both scripts loaded; rounds alternate between them (order flipped every
round), each sending ``--calls`` EVALSHA of one fixed window under its limit (1e9/hour, the gateway
bench's ``under`` row) in pipelines of 50, and reading redis-server's user + system time from
``/proc`` around them. The client's time does not count: this is the server's cost per decision,
the figure the gateway bench sets beside envoyproxy/ratelimit's ``INCRBY`` + ``EXPIRE``.

    .venv/bin/python scripts/bench_redis_script.py OLD.lua src/ratewarden/stores/lua/check.lua
    (OLD.lua, e.g.: git show HEAD~1:src/ratewarden/stores/lua/check.lua > /tmp/old.lua)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path

import redis

from ratewarden.bench.services import free_port, redis_server


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=100_000)
    args = parser.parse_args()
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
        shas = {name: client.script_load(path.read_text()) for name, path in (("A", args.a), ("B", args.b))}
        deadline = str(-(time.time() + 1e6))  # the server clock, with a deadline far ahead
        per_call: dict[str, list[float]] = {"A": [], "B": []}
        for r in range(args.rounds):
            for name in ("A", "B") if r % 2 == 0 else ("B", "A"):
                before = _cpu(server.pid)
                for _ in range(args.calls // 50):
                    pipe = client.pipeline(transaction=False)
                    for _ in range(50):
                        pipe.evalsha(shas[name], 1, f"key-{name}", "h", deadline, "1", "1000000000", "3600",
                                     "1000000000", "0", "1")
                    replies = pipe.execute()
                per_call[name].append(1e6 * (_cpu(server.pid) - before) / args.calls)
                assert replies[-1][0] == 1, replies[-1]  # allowed: the fast path ran
        for name, path in (("A", args.a), ("B", args.b)):
            xs = per_call[name]
            print(f"{name} {path}: Redis CPU per call {statistics.median(xs):.2f} µs median, {min(xs):.2f} min "
                  f"({', '.join(f'{x:.2f}' for x in xs)})")
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
