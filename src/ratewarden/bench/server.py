"""The live driver's server process: one library's app under uvicorn (one worker, uvloop, httptools).

Run as ``python -m ratewarden.bench.server --library L --scenario S --store KIND --store-url URL --port P``.
"""

from __future__ import annotations

import argparse

from .adapters import StoreSpec, load
from .apps import BenchApp
from .scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ratewarden.bench.server")
    parser.add_argument("--library", required=True)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--store", default="memory")
    parser.add_argument("--store-url", default="")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)

    import uvicorn

    adapter = load(args.library)(SCENARIOS[args.scenario], StoreSpec(args.store, args.store_url))
    app = BenchApp(adapter.build(), adapter.start, adapter.reset, adapter.stop)
    uvicorn.run(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools", lifespan="on",
                log_level="warning", access_log=False, workers=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
