"""What a Redis failover admits on one key (issue 28, finding 8): one uvicorn worker serving
``/x`` through RateLimitMiddleware on RedisStore over Sentinel or Cluster (tests/servers.py), ``wrk
-t 2 -c 100 -d 20s`` against it, and the key's primary SIGKILLed ``kill_at`` seconds in. Prints
what was admitted (2xx) against the limit, req/s, what the store said was left just before the
kill, and how long the promotion took (``cluster-nofailover``: no replica takes over).

    .venv/bin/python scripts/failover_admitted.py sentinel|cluster|cluster-nofailover RATE KILL_AT [SECONDS]
    .venv/bin/python scripts/failover_admitted.py sentinel 30000/hour 2

RW_PYTHONPATH runs the app on another source tree (``/path/to/old/src``). Also the app module
uvicorn imports (``failover_admitted:app``, configured by RW_URL and RW_RATE).
"""

# ruff: noqa
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from ratewarden import Limiter, RateLimitMiddleware, Rule
from ratewarden.limiter import storage_key
from ratewarden.stores.redis import RedisStore

HERE = Path(__file__).resolve().parent

RATE = os.environ.get("RW_RATE", "30000/hour")
limiter = Limiter(RedisStore(os.environ.get("RW_URL", "redis://127.0.0.1:6379/0")))
rule = Rule("/x", RATE)


async def endpoint(scope, receive, send):
    body = b"ok"
    if scope["type"] == "http" and scope["path"] == "/state":
        keys = [storage_key(limiter.prefix, rule.name, "127.0.0.1", lim.suffix) for lim in rule.limits]
        try:
            (d,) = await limiter.store.peek(keys, list(rule.limits))
            body = json.dumps({"remaining": d.remaining, "limit": d.limit, "keys": keys,
                               "without_store": dict(limiter.without_store())}).encode()
        except Exception as exc:  # noqa: BLE001
            body = repr(exc).encode()
    elif scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


app = RateLimitMiddleware(endpoint, limiter, [rule])


def main() -> None:
    sys.path.insert(0, str(HERE.parent))
    from tests.servers import HOST, RedisCluster, RedisSentinel, free_port, redis_cmd


    mode = sys.argv[1]            # sentinel | cluster | cluster-nofailover
    rate = sys.argv[2]            # e.g. 30000/hour
    kill_at = float(sys.argv[3])  # seconds into the wrk run
    duration = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    pythonpath = os.environ.get("RW_PYTHONPATH")  # run the app on another tree (a worktree of the old code)

    if mode == "sentinel":
        setup = RedisSentinel().start()
    else:
        setup = RedisCluster().start()
        for srv in setup.servers:  # replicas synced (start() waits only for the slot map)
            deadline = time.monotonic() + 60
            while True:
                info = redis_cmd(srv.port, "INFO", "replication")
                if "role:master" in info or "master_link_status:up" in info:
                    break
                assert time.monotonic() < deadline, info
                time.sleep(0.1)
    port = free_port()
    env = dict(os.environ, RW_URL=setup.url, RW_RATE=rate, PYTHONPATH=os.pathsep.join(p for p in (str(HERE), str(HERE.parent), pythonpath) if p))
    env.pop("WEB_CONCURRENCY", None)
    log = open(f"{tempfile.gettempdir()}/failover-uvicorn-{mode}-{os.getpid()}.log", "w")
    app = subprocess.Popen([sys.executable, "-m", "uvicorn", "failover_admitted:app", "--host", HOST, "--port", str(port),
                            "--no-access-log", "--log-level", "warning"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://{HOST}:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(base + "/state", timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)

    def state():
        return urllib.request.urlopen(base + "/state", timeout=5).read().decode()

    result = {}

    def killer():
        time.sleep(kill_at)
        st = state()
        if mode == "sentinel":
            victim = setup.primary
            first = setup.master_port()
        else:
            key = json.loads(st)["keys"][0]
            slot = redis_cmd(setup.ports[0], "CLUSTER", "KEYSLOT", key)
            owner = None
            for line in redis_cmd(setup.ports[0], "CLUSTER", "NODES").splitlines():
                f = line.split()
                if "master" not in f[2]:
                    continue
                for r in f[8:]:
                    a, _, b = r.partition("-")
                    if int(a) <= int(slot) <= int(b or a):
                        owner = int(f[1].split("@")[0].split(":")[1])
            victim = next(s for s in setup.servers if s.port == owner)
            if mode == "cluster-nofailover":
                for s in setup.servers:
                    if s.port != owner:
                        redis_cmd(s.port, "CONFIG", "SET", "cluster-replica-no-failover", "yes")
        # replication lag at the kill: primary offset vs replica's acknowledged offset
        info = redis_cmd(victim.port, "INFO", "replication")
        result["before_kill"] = st
        result["repl"] = re.findall(r"(master_repl_offset:\d+|slave0:[^\r\n]+)", info)
        rport = int(re.search(r"slave0:ip=[^,]+,port=(\d+)", info).group(1)) if "slave0" in info else None
        t0 = time.monotonic()
        victim.stop()  # SIGKILL
        result["killed_at"] = time.monotonic()
        deadline = t0 + 60
        while time.monotonic() < deadline:
            try:
                if mode == "sentinel":
                    if setup.master_port() != first:
                        break
                elif mode == "cluster":
                    if redis_cmd(rport, "ROLE").splitlines()[0] == "master":
                        break
                else:
                    time.sleep(0.5)
                    if time.monotonic() - t0 > duration:
                        break
                    continue
            except Exception:
                pass
            time.sleep(0.05)
        result["failover_s"] = round(time.monotonic() - t0, 2) if mode != "cluster-nofailover" else None

    th = threading.Thread(target=killer)
    th.start()
    out = subprocess.run(["wrk", "-t", "2", "-c", "100", "-d", f"{duration}s", base + "/x"], capture_output=True, text=True).stdout
    th.join()
    time.sleep(0.5)
    after = state()
    total = int(re.search(r"(\d+) requests in", out).group(1))
    non2xx = int(m.group(1)) if (m := re.search(r"Non-2xx or 3xx responses: (\d+)", out)) else 0
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)
    app.terminate()
    app.wait(10)
    log.close()
    logtext = open(log.name).read()
    setup.close()
    print(json.dumps({"mode": mode, "rate": rate, "kill_at": kill_at, "total": total, "admitted": total - non2xx,
                      "rejected": non2xx, "rps": rps, **result, "after": after,
                      "errors": [l for l in logtext.splitlines() if "Error" in l or "Traceback" in l][:8],
                      "writelines": "writelines" in logtext, "log": log.name}, indent=1))


if __name__ == "__main__":
    main()
