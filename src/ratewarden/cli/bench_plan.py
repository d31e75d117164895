"""``ratewarden bench``'s flags checked and turned into the run they ask for (``plan``), with a
plain message naming the first flag that is wrong, before anything runs."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..bench.scenarios import QUICK_FLOOD, QUICK_LIVE, QUICK_SCENARIOS, resolve

if TYPE_CHECKING:
    from ..bench.runner import Options

__all__ = ["QUICK_LIBRARIES", "csv_list", "given", "plan", "unwritable"]

QUICK_LIBRARIES = "ratewarden,traffik,slowapi,bare"
#: What ``--rlflx`` runs where its flag is not given: seed 001's table (rate-limiter-flexible behind fastify,
#: its light and heavy routes, Redis standalone and a 3+3 cluster, 50/100/500 connections) beside ratewarden.
RLFLX = {"scenario": ["live.light,live.heavy"], "store": "redis,redis-cluster", "concurrency": "50,100,500",
         "library": "ratewarden,rlflx-ioredis,rlflx-iovalkey,rlflx-glide,bare,fastify-bare"}
_T = TypeVar("_T")


def csv_list(value: str) -> list[str]:
    """The items of a comma-separated flag value."""
    return [v.strip() for v in value.split(",") if v.strip()]


def plan(args: argparse.Namespace) -> tuple[Options, Path] | str:
    """The run the arguments ask for, or what is wrong with them (before anything runs): the
    checks run in this order, and the first failing one gives the message."""
    if getattr(args, "rlflx", False):
        args = argparse.Namespace(**{**vars(args), **{k: getattr(args, k) or v for k, v in RLFLX.items()}})
    names, duration, flood_duration, iterations = _quick_defaults(args)
    warmup_duration = max(1.0, min(2.0, duration / 2))
    scenarios = _scenarios(args, names)
    if isinstance(scenarios, str):
        return scenarios
    libraries = _libraries(args)
    if isinstance(libraries, str):
        return libraries
    if not args.library:  # the Node peers run when named (--library, --rlflx), never by default
        from ..bench.adapters import OPT_IN

        libraries = [lib for lib in libraries if lib not in OPT_IN]
    store_plan = _stores(args, scenarios)
    if isinstance(store_plan, str):
        return store_plan
    stores, worker_stores, flood_stores = store_plan
    try:
        levels = [int(c) for c in csv_list(args.concurrency)]
    except ValueError:
        return f"--concurrency takes comma-separated integers, got {args.concurrency!r}"
    if any(c < 1 for c in levels) or iterations < 1 or args.warmup < 0 or duration <= 0 \
            or flood_duration <= 0:
        return "--concurrency, --iterations, --duration and --flood-duration must be positive (--warmup >= 0)"
    if args.workers < 0 or args.workers == 1:
        return f"--workers takes 2 or more (0 = one per core, at least 2), got {args.workers}"
    from ..bench.drivers.live import LiveError, require_wrk

    if any(s.mode == "live" for s in scenarios):
        try:
            require_wrk()
        except LiveError as exc:
            return str(exc)
    out = Path(args.out)
    problem = unwritable(out)
    if problem:
        return f"--out {out}: {problem}; give a directory that can be created and written"
    from ..bench.runner import Options

    opts = Options(scenarios=scenarios, libraries=libraries, stores=stores, iterations=iterations,
                   warmup=args.warmup, concurrency=levels or None, duration=duration,
                   warmup_duration=warmup_duration, redis_url=args.redis_url, memcached_url=args.memcached_url,
                   redis_cluster_url=args.redis_cluster_url, workers=args.workers,
                   worker_stores=worker_stores, flood_stores=flood_stores, flood_duration=flood_duration)
    return opts, out


def _quick_defaults(args: argparse.Namespace) -> tuple[list[str], float, float, int]:
    """The scenarios ``--quick`` adds (when no ``--scenario`` is given), and the live duration,
    flood duration and iterations: ``--quick`` shortens the ones left at their defaults."""
    if not args.quick:
        return [], given(args.duration, 10.0), given(args.flood_duration, 3.0), given(args.iterations, 3)
    names = list(QUICK_SCENARIOS + QUICK_LIVE + QUICK_FLOOD) if args.scenario is None else []
    # Short live iterations, the usual 3 interleaved rounds (min, median, max: how noisy the machine was):
    # make bench's first run, wheel build included, stays within about 4 minutes on 2 cores.
    return names, given(args.duration, 2.0), given(args.flood_duration, 2.0), given(args.iterations, 3)


def given(value: _T | None, default: _T) -> _T:
    """An option's value, or the mode's default when it was not given."""
    return default if value is None else value


def _scenarios(args: argparse.Namespace, names: list[str]) -> list[Any] | str:
    """The scenarios named (``--scenario``, else all or the quick ones) that ``--driver`` runs."""
    for value in args.scenario or ([] if args.quick else ["all"]):
        names = names + csv_list(value)
    try:
        scenarios = resolve(names)
    except KeyError as exc:
        return f"unknown scenario {exc.args[0]!r}; run `ratewarden bench --list` to see them"
    if args.driver == "inprocess":
        scenarios = [s for s in scenarios if s.mode != "live"]
    elif args.driver == "live":
        scenarios = [s for s in scenarios if s.mode == "live"]
    if not scenarios:
        return "no scenario left to run (check --scenario and --driver)"
    return scenarios


def _libraries(args: argparse.Namespace) -> list[str] | str:
    """The libraries to compare (``--library``, else every one or the quick ones), each importable."""
    from ..bench.adapters import LIBRARIES, load

    libraries = csv_list(args.library or (QUICK_LIBRARIES if args.quick else ",".join(LIBRARIES)))
    for lib in libraries:
        if lib not in LIBRARIES:
            return f"unknown library {lib!r}; choose from {', '.join(LIBRARIES)}"
        try:
            load(lib)
        except ImportError as exc:
            return str(exc)
    return libraries


def _stores(args: argparse.Namespace, scenarios: list[Any]) -> tuple[list[str], list[str], list[str]] | str:
    """The stores of the in-process runs, of the multi-worker scenario and of the floods
    (``--store`` for all three, else each one's defaults)."""
    from ..bench.runner import WORKER_STORES
    from ..bench.services import STORES, redis_server

    stores = csv_list(args.store or "memory")
    worker_stores = stores if args.store else list(WORKER_STORES)
    if not args.store and not args.redis_url and shutil.which(redis_server()) is None \
            and any(s.workers != 1 for s in scenarios):
        print("ratewarden bench: redis-server is not installed and no --redis-url given: the multi-worker "
              "scenario runs without its Redis row", file=sys.stderr)
        worker_stores.remove("redis")
    flood_stores = stores if args.store else _flood_stores(args, scenarios)
    if args.quick and not args.store:
        flood_stores = flood_stores[:1]  # one store: the first shared one available
    for store in stores:
        if store not in STORES:
            return f"unknown store {store!r}; choose from {', '.join(STORES)}"
    return stores, worker_stores, flood_stores


def _flood_stores(args: argparse.Namespace, scenarios: list[Any]) -> list[str]:
    """The flood scenarios' default stores: Redis and Memcached where a server can be had (a URL, or
    the binary to start one), then memory."""
    from ..bench.runner import FLOOD_STORES
    from ..bench.services import redis_server

    have = {"redis": bool(args.redis_url) or shutil.which(redis_server()) is not None,
            "memcached": bool(args.memcached_url) or shutil.which("memcached") is not None}
    missing = [kind for kind, ok in have.items() if not ok]
    if missing and any(s.group == "flood" for s in scenarios) and not args.quick:
        print(f"ratewarden bench: {' and '.join(missing)} not installed and no URL given: the flood scenarios "
              f"run without {'that store' if len(missing) == 1 else 'those stores'}", file=sys.stderr)
    return [s for s in FLOOD_STORES if have.get(s, True)]


def unwritable(out: Path) -> str:
    """Why the reports could not be written into ``out`` ("" when they can): checked before the
    run, by creating the directory and a probe file, so a bad ``--out`` never costs the results."""
    import tempfile

    if out.exists() and not out.is_dir():
        return "is an existing file, not a directory"
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".ratewarden-probe-"):
            pass
    except OSError as exc:
        return f"not writable ({exc.strerror or exc})"
    return ""
