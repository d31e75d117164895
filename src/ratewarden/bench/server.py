"""The live driver's server process: one library's app under uvicorn (uvloop, httptools), one or N workers.

Run as ``python -m ratewarden.bench.server --library L --scenario S --store KIND --store-url URL --port P
[--workers N]``. With N > 1 uvicorn spawns the workers, and each builds the app itself from the import
string ``ratewarden.bench.server:create_app`` and the configuration in ``RATEWARDEN_BENCH_APP``; stores
are set up by the harness (the parent), never here.
"""

from __future__ import annotations

import argparse
import json
import os

from .adapters import StoreSpec, load
from .apps import BenchApp
from .scenarios import SCENARIOS

ENV = "RATEWARDEN_BENCH_APP"


def create_app() -> BenchApp:
    """The app described by ``RATEWARDEN_BENCH_APP`` (JSON: library, scenario, store, store_url)."""
    raw = os.environ.get(ENV)
    if not raw:
        raise RuntimeError(f"{ENV} is not set: start workers through `python -m ratewarden.bench.server`")
    cfg = json.loads(raw)
    adapter = load(cfg["library"])(SCENARIOS[cfg["scenario"]], StoreSpec(cfg["store"], cfg["store_url"]))
    return BenchApp(adapter.build(), adapter.start, adapter.reset, adapter.stop, adapter.without_store)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ratewarden.bench.server")
    parser.add_argument("--library", required=True)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--store", default="memory")
    parser.add_argument("--store-url", default="")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)

    import uvicorn

    os.environ[ENV] = json.dumps({"library": args.library, "scenario": args.scenario, "store": args.store,
                                  "store_url": args.store_url})
    common = {"host": "127.0.0.1", "port": args.port, "loop": "uvloop", "http": "httptools", "lifespan": "on",
              "log_level": "warning", "access_log": False}
    if args.workers > 1:
        uvicorn.run("ratewarden.bench.server:create_app", factory=True, workers=args.workers, **common)
    else:
        uvicorn.run(create_app(), workers=1, **common)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
