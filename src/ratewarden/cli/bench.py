"""``ratewarden bench``: flags, validation with plain error messages, progress bar and terminal summary."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..bench.scenarios import MEASURES, SCENARIOS
from .bench_plan import QUICK_LIBRARIES, csv_list, given, plan, unwritable

if TYPE_CHECKING:
    from ..bench.runner import Options

__all__ = ["register", "run"]



class _HelpWithDefaults(argparse.HelpFormatter):
    """Adds ``(default: X)`` to an option's help unless the help already states its default or the
    default is empty (``ArgumentDefaultsHelpFormatter`` printed both, and ``(default: )``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        empty = default is None or default is False or default == "" or default == argparse.SUPPRESS
        if "default" in text or not action.option_strings or empty:
            return text
        return text + " (default: %(default)s)"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark ratewarden against traffik, slowapi, limits and no limiter",
        description="Runs the reference benchmark scenarios for several rate limiters on the same app and "
                    "writes JSON, CSV, Markdown and a self-contained HTML report.",
        formatter_class=_HelpWithDefaults,
    )
    p.add_argument("--quick", action="store_true",
                   help="memory store, core in-process scenarios, two short live scenarios (live.allowed: all "
                        "allowed; live.light: a hot key, mostly 429s) and one short flood (flood.middleware on "
                        "Redis, else Memcached, else memory); 3 interleaved rounds of 2 s live iterations (about 2 min)")
    p.add_argument("--rlflx", action="store_true",
                   help="the Node.js comparison: rate-limiter-flexible behind fastify (Node; libraries rlflx-ioredis, "
                        "rlflx-iovalkey, rlflx-glide) beside ratewarden on the same Redis and Redis Cluster, in "
                        "the same wrk rounds; defaults --scenario live.light,live.heavy --store redis,redis-cluster "
                        "--concurrency 50,100,500 --library ratewarden,rlflx-ioredis,rlflx-iovalkey,rlflx-glide,"
                        "bare,fastify-bare (each overridable; fastify-bare: the Node app without a limiter, the "
                        "Node rows' x bare); npm ci installs the app once into ~/.cache/ratewarden/node; rows "
                        "skipped with the reason without Node 20+, and for iovalkey and valkey-glide without Valkey 8+")
    p.add_argument("--scenario", action="append", default=None, metavar="NAMES",
                   help="comma-separated scenario keys or groups (dependency, middleware, correctness, websocket, "
                        "strategy, headers, rules, workload, tiered, live, workers, flood, http, mw, ws, all); "
                        "see --list")
    p.add_argument("--library", default="", metavar="NAMES",
                   help="comma-separated libraries: ratewarden, traffik, slowapi, limits, bare (default: all; "
                        f"--quick: {QUICK_LIBRARIES}); the Litestar pair, against bare Litestar, when named: "
                        "litestar-bare, litestar (its RateLimitConfig), ratewarden-litestar")
    p.add_argument("--store", default=None, metavar="NAMES",
                   help="comma-separated: memory, shm, redis, redis-cluster, memcached (default: memory; for the "
                        "multi-worker scenario: memory, shm, redis; for the flood scenarios: redis, memcached, "
                        "memory)")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="uvicorn worker processes for the multi-worker scenario (live.workers); "
                        "0 = one per core, at least 2")
    p.add_argument("--redis-url", default="", help="Redis to use (default: start a private redis-server)")
    p.add_argument("--redis-server", default="", metavar="PROGRAM",
                   help="the server to start for a private Redis or Redis Cluster, on PATH or a path: "
                        "valkey-server for Valkey, e.g. ~/.cache/ratewarden/valkey-9.1.2/valkey-server (what "
                        "scripts/install-valkey.sh installs); default redis-server")
    p.add_argument("--redis-cluster-url", default="",
                   help="Redis Cluster to use, redis+cluster://host:port (default: start a private 6-node "
                        "cluster, 3 primaries + 3 replicas)")
    p.add_argument("--memcached-url", default="", help="Memcached to use, memcached://host:port "
                                                       "(default: start a private memcached)")
    p.add_argument("--driver", choices=("all", "inprocess", "live"), default="all",
                   help="keep only in-process (direct ASGI) or live (uvicorn + wrk) scenarios")
    p.add_argument("--concurrency", default="", metavar="N[,N...]",
                   help="concurrency levels for batch and live scenarios (default: each scenario's own)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds per live (wrk) iteration (default 10; --quick: 2)")
    p.add_argument("--flood-duration", type=float, default=None, metavar="SECONDS",
                   help="seconds per timed iteration of the flood scenarios, 1,000 connections (default 3; --quick: 2)")
    p.add_argument("--iterations", type=int, default=None,
                   help="timed iterations (rounds, libraries interleaved) per configuration: median kept, spread "
                        "reported (default 3; --gateway: 5)")
    p.add_argument("--warmup", type=int, default=1, help="discarded warm-up iterations per configuration")
    p.add_argument("--out", default="bench-results", help="directory for the reports")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--wsgi", action="store_true",
                   help="run the WSGI rows instead: bare Flask and Django, flask-limiter, django-ratelimit and "
                        "ratewarden's WSGI integrations on --store memory and/or redis, --iterations rounds (at "
                        "least 3): in-process (direct PEP 3333 calls), then live (gunicorn with --workers sync "
                        "workers, default 2, under wrk for --duration s, default 3 s here, at --concurrency, "
                        "default 50; on memory ratewarden uses its SharedMemoryStore and the peers count per "
                        "process); --driver keeps one of the two; writes wsgi.md and wsgi.json in --out "
                        "(the live rows: about 3 minutes per store at 3 rounds)")
    p.add_argument("--gateway", action="store_true",
                   help="run the gateway bench instead (`ratewarden serve` against the gateways' own limiting): HAProxy and nginx in front of a "
                        "fast backend, without limiting, with their own limiting and with `ratewarden serve`, "
                        "interleaved --iterations rounds (default 5); then the service's capacity over HTTP and "
                        "gRPC against a fixed-answer floor; then gRPC beside envoyproxy/ratelimit on one Redis "
                        "(Python grpc, the compiled front door, the reference; ghz, 3 rounds); writes report.html and "
                        "report.md (the verdict against each peer first), results.json, summary.csv, capacity.csv "
                        "and peers.csv in --out (needs haproxy, nginx, wrk and "
                        "the serve extra; Go and redis-server for the reference rows, which are skipped with the "
                        "reason otherwise); --quick: 2 rounds, 2000 gRPC calls per cell")
    _register_gateway(p)
    p.set_defaults(func=run)


def _register_gateway(p: argparse.ArgumentParser) -> None:
    """The ``--gateway`` bench's own flags."""
    p.add_argument("--gateway-requests", type=int, default=300, metavar="N",
                   help="--gateway: requests per variant per round (15 workers)")
    p.add_argument("--gateway-rate", type=float, default=750.0, metavar="REQ_PER_S",
                   help="--gateway: pace of those requests (the reference runs used ~750 req/s); 0 = as fast as they go")
    p.add_argument("--gateway-variants", default="", metavar="NAMES",
                   help="--gateway: comma-separated variants (default all): " + ", ".join(_gateway_variants()))
    p.add_argument("--capacity-seconds", type=float, default=2.0, metavar="SECONDS",
                   help="--gateway: seconds per capacity run (HTTP /check with wrk, gRPC ShouldRateLimit)")
    p.add_argument("--no-capacity", action="store_true", help="--gateway: skip the service capacity runs")
    p.add_argument("--no-peers", action="store_true",
                   help="--gateway: skip the gRPC rows beside envoyproxy/ratelimit (ghz; both built with go install)")
    p.add_argument("--peers-only", action="store_true",
                   help="--gateway: only the gRPC rows beside envoyproxy/ratelimit (no HAProxy, nginx or capacity)")
    p.add_argument("--peer-requests", type=int, default=None, metavar="N",
                   help="--gateway: ghz calls per gRPC cell (default 20000; --quick: 2000)")
    p.add_argument("--peer-rounds", type=int, default=None, metavar="N",
                   help="--gateway: interleaved rounds of the gRPC rows (default 3; --quick: 2)")


def _gateway_variants() -> list[str]:
    from ..bench.gateway_setup import VARIANTS

    return list(VARIANTS)


def _fail(message: str) -> int:
    print(f"ratewarden bench: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.list:
        for sc in SCENARIOS.values():
            print(f"{sc.key:22} {sc.group:12} {sc.title}")
        return 0
    from ..bench.services import REDIS_SERVER

    if args.redis_server:
        if shutil.which(os.path.expanduser(args.redis_server)) is None:
            return _fail(f"--redis-server: no program {args.redis_server!r} (on PATH, or an executable file)")
        os.environ[REDIS_SERVER] = os.path.expanduser(args.redis_server)  # its worker processes start it too
    if args.wsgi:
        return _run_wsgi(args)
    if args.gateway:
        return _run_gateway(args)
    planned = plan(args)
    if isinstance(planned, str):
        return _fail(planned)
    opts, out = planned
    from ..bench.drivers.live import LiveError
    from ..bench.reports import write_all
    from ..bench.services import BenchError

    meta = _meta(opts)
    t0 = time.monotonic()
    before = os.getloadavg()
    try:
        results = _run_with_progress(opts)
    except (BenchError, LiveError) as exc:
        return _fail(str(exc))
    load = _load_line(before, os.getloadavg())
    meta.method["Machine load"] = load
    if args.redis_server:
        meta.method["Redis server"] = f"{os.environ[REDIS_SERVER]} (--redis-server), for every private Redis"
    try:
        paths = write_all(out, results, meta)
    except OSError as exc:
        _summary(results, load)
        return _fail(f"--out {out}: cannot write the reports: {exc.strerror or exc}")
    _summary(results, load)
    print(f"reports: {out / 'report.html'}, {out / 'report.md'}, {out / 'summary.csv'}, {out / 'results.json'} "
          f"({len(paths)} files) in {time.monotonic() - t0:.0f} s")
    return 0


def _run_wsgi(args: argparse.Namespace) -> int:
    """``--wsgi``: the in-process WSGI rows (``bench.wsgi``) and their targets, then the live rows
    under gunicorn and wrk (``bench.wsgi_live``); ``--driver`` keeps one of the two."""
    import contextlib

    from ..bench import wsgi, wsgi_live
    from ..bench.drivers.live import LiveError, require_wrk
    from ..bench.services import BenchError, StoreService

    stores = csv_list(args.store or "memory")
    if not stores or any(s not in ("memory", "redis") for s in stores):
        return _fail(f"--wsgi runs on --store memory and/or redis, got {args.store!r}")
    try:
        levels = [int(c) for c in csv_list(args.concurrency)]
    except ValueError:
        return _fail(f"--concurrency takes comma-separated integers, got {args.concurrency!r}")
    # Live rows: 3 s wrk runs unless --duration says otherwise, 2 sync workers unless --workers does.
    duration = given(args.duration, 3.0)
    workers = args.workers or 2
    if any(c < 1 for c in levels) or duration <= 0 or args.warmup < 0 or workers < 1:
        return _fail("--concurrency, --duration and --workers must be positive (--warmup >= 0)")
    if args.driver != "inprocess":
        try:
            require_wrk()
        except LiveError as exc:
            return _fail(str(exc))
    out = Path(args.out)
    problem = unwritable(out)
    if problem:
        return _fail(f"--out {out}: {problem}; give a directory that can be created and written")
    rounds, concurrency = max(3, given(args.iterations, 3)), (levels or [50])[0]
    rows: list[Any] = []
    targets: list[dict[str, Any]] = []
    live_rows: list[Any] = []
    before = os.getloadavg()
    try:
        with contextlib.ExitStack() as stack:
            redis_url = args.redis_url
            if "redis" in stores and not redis_url:  # one private redis-server for both parts
                redis_url = stack.enter_context(StoreService("redis")).url
            if args.driver != "live":
                rows, targets = wsgi.run(stores, redis_url=redis_url, rounds=rounds)
            if args.driver != "inprocess":
                live_rows = wsgi_live.run_live(stores, redis_url=redis_url, workers=workers, duration=duration,
                                               warmup_duration=min(1.0, duration), rounds=rounds,
                                               warmup=args.warmup, concurrency=concurrency)
    except (BenchError, LiveError) as exc:
        return _fail(str(exc))
    method = wsgi_live.describe(workers, duration, rounds, args.warmup, concurrency) + "; " \
        + _load_line(before, os.getloadavg())
    print(wsgi.write(out, rows, targets, live_rows, method))
    print(f"reports: {out / 'wsgi.md'}, {out / 'wsgi.json'}")
    return 0


def _run_gateway(args: argparse.Namespace) -> int:
    """``--gateway``: the reference set-up's scenario through HAProxy and nginx, the service's capacity, and
    gRPC beside envoyproxy/ratelimit (``bench.gateway``)."""
    from ..bench import gateway, gateway_report
    from ..bench.gateway_setup import VARIANTS, GatewayOptions
    from ..bench.services import BenchError

    variants = csv_list(args.gateway_variants) or list(VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        return _fail(f"unknown --gateway-variants {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    rounds = given(args.iterations, 2 if args.quick else 5)
    peer_rounds, peer_requests = given(args.peer_rounds, 2 if args.quick else 3), \
        given(args.peer_requests, 2000 if args.quick else 20000)
    if rounds < 1 or args.warmup < 0 or args.gateway_requests < 1 or args.gateway_rate < 0 \
            or args.capacity_seconds <= 0 or peer_rounds < 1 or peer_requests < 1:
        return _fail("--iterations, --gateway-requests, --capacity-seconds, --peer-rounds and --peer-requests must "
                     "be positive (--warmup and --gateway-rate >= 0)")
    if args.peers_only and args.no_peers:
        return _fail("--peers-only and --no-peers ask for nothing to run; give one of them")
    out = Path(args.out)
    problem = unwritable(out)
    if problem:
        return _fail(f"--out {out}: {problem}; give a directory that can be created and written")
    opts = GatewayOptions(rounds=rounds, warmup=args.warmup, requests=args.gateway_requests,
                          rate=args.gateway_rate, variants=[] if args.peers_only else variants,
                          capacity=not (args.no_capacity or args.peers_only),
                          capacity_seconds=1.0 if args.quick else args.capacity_seconds, capacity_rounds=rounds,
                          peers=not args.no_peers, peer_rounds=peer_rounds, peer_requests=peer_requests)
    before = os.getloadavg()
    t0 = time.monotonic()
    try:
        report = gateway.run(opts, log=lambda line: print(line, file=sys.stderr))
    except BenchError as exc:
        return _fail(str(exc))
    report.meta = {"command": "ratewarden bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
                   "load": _load_line(before, os.getloadavg()), "seconds": round(time.monotonic() - t0, 1)}
    paths = gateway_report.write(out, report)
    print(gateway_report.summary(report, paths[0]))  # ends with the report's path and the files beside it
    return 0


def _load_line(before: tuple[float, float, float], after: tuple[float, float, float]) -> str:
    """The load average (1/5/15 min) at the start and at the end of the run, against the core count."""
    def fmt(t: tuple[float, float, float]) -> str:
        return "/".join(f"{v:.2f}" for v in t)

    cores = len(os.sched_getaffinity(0))
    busy = " (above the core count: other work competed for the CPU)" if max(before[0], after[0]) > cores else ""
    return f"load average (1/5/15 min) {fmt(before)} at the start, {fmt(after)} at the end, on {cores} cores{busy}"


def _meta(opts: Options) -> Any:
    """What the reports say about how they were produced."""
    from ..bench.reports.meta import collect_meta

    command = "ratewarden bench " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["bench"] \
        else "ratewarden bench"
    only_flood = all(s.group == "flood" for s in opts.scenarios if s.mode == "live")
    wrk_s = opts.flood_duration if only_flood else opts.duration
    return collect_meta(command, {
        "Method": f"{opts.warmup} warm-up + {opts.iterations} timed iterations per configuration; the median "
                  "iteration by req/s is reported (latencies from that same iteration, nearest-rank "
                  "percentiles); store flushed and limiter reset before every iteration",
        "In-process driver": "direct ASGI calls, no HTTP client or socket",
        "Live driver": f"uvicorn, 1 worker, uvloop + httptools, access log off; wrk {wrk_s:g} s per "
                       "iteration; every library's server up at once and the iterations interleaved in rounds "
                       "(each round runs every library once, starting one further on); server and wrk pinned "
                       "to different cores; server CPU/RSS sampled",
        "Spread": "req/s over the timed rounds of each row: min-max and coefficient of variation (cv), and the "
                  "ratio to no limiter round by round (min-max); the report says how noisy the machine was",
        "Headings": "rows are headed by what they measure: all allowed (overhead on served requests), allowed "
                    "up to the limit then rejected, mostly rejected (429s: cost of a rejection, which skips "
                    "the handler, so above 1.00x bare is possible), admitted against the limit",
        "Admitted / limit": "admitted = the handler runs the server counted itself (2xx responses where it "
                            "could not say); limit = the most an exact limiter admits in one iteration; "
                            "exact = admitted what an exact limiter admits (live: the limit for one key, or every "
                            "request when fewer came; 'within' where only a ceiling is known); "
                            "⚠ marks a row that admitted more than its limit (its req/s and ratio to no "
                            "limiter are not comparable)",
    } | ({
        "Flood driver": f"{opts.flood_duration:g} s per iteration, 1,000 wrk connections from one client IP, "
                        "one uvicorn worker, 100/hour fixed window per client IP; stores: "
                        + ", ".join(opts.flood_stores or opts.stores),
    } if any(s.group == "flood" for s in opts.scenarios) else {}) | ({
        "Multi-worker driver": "uvicorn --workers N (each worker builds the app from an import string), "
                               "nothing pinned; a fresh hot key per iteration, runs kept clear of a window "
                               "boundary; CPU and RSS summed over the uvicorn processes",
    } if any(s.workers != 1 for s in opts.scenarios) else {}) | _rlflx_meta(opts))


def _rlflx_meta(opts: Options) -> dict[str, str]:
    """How the rate-limiter-flexible rows ran, when the run has them."""
    from ..bench import rlflx

    return {"rate-limiter-flexible rows": rlflx.describe()} if any(map(rlflx.is_peer, opts.libraries)) else {}


def _run_with_progress(opts: Any) -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..bench.runner import Result, Task, plan_tasks, run_all

    total = len(plan_tasks(opts))
    with Progress(TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), transient=False) as progress:
        bar = progress.add_task("starting", total=total)
        started = time.monotonic()
        begun = 0

        def on_start(task: Task) -> None:
            nonlocal begun
            begun += 1
            progress.update(bar, description=task.label)
            if not progress.console.is_terminal:  # a log (CI, a pipe) gets a line per step instead of the bar
                print(f"bench [{time.monotonic() - started:.0f} s] {begun}/{total} {task.label}", flush=True)

        def on_done(result: Result) -> None:
            if result.skipped and not result.skipped.startswith(("traffik never", "slowapi has no", "limits has no", "limits sends no")):
                progress.console.print(f"[yellow]skipped[/] {result.task.label}: {result.skipped}")
            progress.advance(bar)

        return run_all(opts, on_start, on_done)


def _summary(results: list[Any], load: str = "") -> None:
    """The terminal summary: one table per kind of row (what it measures), then the flags and how
    noisy the machine was."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from ..bench.reports.markdown import heading, noise_lines

    rows = [r.row for r in results if r.row is not None]
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    rank = {heading(r): (r.driver != "inprocess", r.group in ("workers", "flood"), list(MEASURES).index(r.measure))
            for r in rows}
    titles = sorted(rank, key=rank.__getitem__)
    notes: list[str] = []
    for title in titles:
        table = Table(title=f"{title} (median of the rounds)", show_lines=False, title_justify="left")
        for col in ("scenario", "library", "store", "c", "req/s", "rounds: min-max (cv)", "x bare", "x bare rounds",
                    "p99 ms", "ok %", "429 %", "exact", "admitted / limit"):
            table.add_column(col, justify="left" if col in ("scenario", "library", "store") else "right")
        for row in (r for r in rows if heading(r) == title):
            ratio = f"{row.vs_bare:.2f}" if row.vs_bare and row.library != "bare" else ""
            rps, ratios = f"{row.rps:,.0f}", row.ratio_spread_cell
            admitted, exact = escape(row.admitted_cell), row.exact_cell
            if row.over_limit:  # a fast figure over its limit is not a win: every throughput cell says so
                rps, admitted = f"[red]⚠ {rps}[/]", f"[bold red]{admitted}[/]"
                ratio, ratios = (f"[red]⚠ {x}[/]" if x else "" for x in (ratio, ratios))
                exact = f"[bold red]{exact}[/]"
            elif exact == "NO":
                exact = "[red]NO[/]"
            table.add_row(row.scenario, row.library, row.store, str(row.concurrency), rps, row.spread_cell, ratio,
                          ratios, f"{row.p99_ms:.2f}", f"{row.success_pct:.0f}", f"{row.throttled_pct:.0f}", exact,
                          admitted)
            if row.without_store:
                notes.append(f"{row.library} · {row.scenario} · {row.store}: {row.without_store_cell}")
        console.print(table)
    over = [r for r in rows if r.over_limit]
    if over:
        console.print(f"[bold red]⚠ {len(over)} row(s) admitted more than the limit[/] (req/s and x bare of those "
                      "rows are not comparable): " + escape("; ".join(
                          f"{r.library} · {r.scenario} · {r.store} {r.admitted_cell.lstrip('⚠ ')}" for r in over)))
    if notes:
        console.print("checks decided without the store (Limiter.without_store()):")
        for line in notes:
            console.print("  " + escape(line))
    noise = noise_lines(rows) + ([load] if load else [])
    if noise:
        console.print("how noisy the machine was:")
        for line in noise:
            console.print("  " + escape(line))
