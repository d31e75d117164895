"""Markdown tables in the shape of the reference reports (also reused, as data, by the HTML writer)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..results import Row, spread
from ..runner import Result
from ..scenarios import MEASURES
from .meta import Meta

__all__ = ["GROUP_TITLES", "SHORT_MEASURES", "Table", "build_tables", "cluster_tables", "heading", "library_order",
           "noise_lines", "over_limit_lines", "render_markdown", "workers_tables"]

GROUP_TITLES = {
    "dependency": "HTTP dependency mode",
    "middleware": "Middleware mode",
    "correctness": "Correctness under concurrency",
    "websocket": "WebSocket messages",
    "strategy": "Strategy comparison (200 requests vs 100/min)",
    "headers": "Response-headers overhead (middleware, 500 requests, 50 concurrent)",
    "rules": "Rules-registry overhead (middleware, 500 requests, 50 concurrent)",
    "workload": "Workloads and key distribution",
    "tiered": "Tiered API keys",
    "live": "Live server (uvicorn + wrk)",
    "workers": "Several uvicorn workers on one host: allowed against the exact limit",
    "flood": "Flood (1,000 connections, one client IP, one uvicorn worker): admitted against the limit",
}
_STORE_NAMES = {
    ("ratewarden", "memory"): "MemoryStore (per process)",
    ("ratewarden", "shm"): "SharedMemoryStore",
    ("ratewarden", "redis"): "RedisStore (check timeout 1 s)",
    ("traffik", "shm"): "MultiProcessInMemoryBackend (experimental)",
    ("traffik", "memory"): "InMemoryBackend (per process)",
    ("slowapi", "memory"): "memory:// (per process)",
}
_LIB_ORDER = ("ratewarden", "traffik", "slowapi", "limits")
#: Short forms of :data:`MEASURES` for chart labels.
SHORT_MEASURES = {"allowed": "allowed", "mixed": "mixed", "rejected": "429s",
                  "admitted": "admitted", "": ""}


@dataclass
class Table:
    """A titled table: section (driver/store), group, title, header and body cells."""

    section: str
    group: str
    title: str
    header: list[str]
    body: list[list[str]]
    note: str = ""


def library_order(names: Sequence[str]) -> list[str]:
    rest = sorted(n for n in set(names) if n not in _LIB_ORDER and n != "bare")
    return [n for n in _LIB_ORDER if n in names] + rest + (["bare"] if "bare" in names else [])


def _n(v: float) -> str:
    return f"{v:,.0f}"


def _ms(v: float) -> str:
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def _pct(v: float) -> str:
    return f"{v:.0f}%" if abs(v - round(v)) < 0.05 else f"{v:.1f}%"


def _throughput_cell(r: Row) -> str:
    parts = [] if r.library == "bare" else [f"{r.vs_bare:.2f}x bare" if r.vs_bare else "", f"{_pct(r.success_pct)} ok"]
    if r.rps_cv_pct is not None and r.iterations > 1:
        parts.append(f"cv {r.rps_cv_pct:.0f}%")
    if r.calls_per_request is not None:
        parts.append(f"{r.calls_per_request:.2f} cmd/req")
    if r.over_limit:
        parts.append(f"over limit: {r.admitted_cell.lstrip('⚠ ')} admitted")
    extra = ", ".join(p for p in parts if p)
    cell = f"{_n(r.rps)} ({extra})" if extra else _n(r.rps)
    return _flag(r, cell)


def _flag(r: Row, cell: str) -> str:
    """``cell`` marked ``⚠`` when ``r`` admitted more than its limit (the HTML report colours such cells)."""
    return f"⚠ {cell}" if r.over_limit and cell not in ("", "—") else cell


def _ratio(r: Row) -> str:
    """The ratio to no limiter, flagged on a row over its limit (a fast figure over the limit is no win)."""
    return _flag(r, f"{r.vs_bare:.2f}x") if r.vs_bare and r.library != "bare" else "—"


def _section(r: Row) -> str:
    if r.driver == "live":
        return f"live · store {r.store}" if r.store not in ("none", "memory") else "live"
    return f"in-process · store {r.store}" if r.store not in ("none", "memory") else "in-process"


def heading(r: Row) -> str:
    """What a row measures, as the terminal summary heads it: driver, then the kind of traffic."""
    if r.group == "flood":
        return f"{GROUP_TITLES['flood']}"
    if r.group == "workers":
        return GROUP_TITLES["workers"]
    driver = "Live server (uvicorn + wrk)" if r.driver == "live" else "In-process (direct ASGI calls)"
    return f"{driver} · {MEASURES[r.measure]}"


def noise_lines(rows: Sequence[Row]) -> list[str]:
    """How noisy the machine was: the coefficient of variation of req/s over the timed rounds of
    each row, per driver (median and largest, and which row), with how many rounds."""
    out: list[str] = []
    for driver, name in (("inprocess", "in-process"), ("live", "live")):
        mine = [r for r in rows if r.driver == driver and r.rps_cv_pct is not None and r.iterations > 1]
        if not mine:
            continue
        cvs = spread([r.rps_cv_pct or 0.0 for r in mine])
        worst = max(mine, key=lambda r: r.rps_cv_pct or 0.0)
        rounds = "/".join(str(n) for n in sorted({r.iterations for r in mine}))
        if cvs:
            out.append(f"{name} req/s over {rounds} rounds per row: coefficient of variation median "
                       f"{cvs.median:.1f}%, lowest {cvs.min:.1f}%, largest {cvs.max:.1f}% "
                       f"({worst.library} · {worst.scenario} · {worst.store})")
    if out:
        out.append("a difference between two libraries smaller than their rows' min-max range over the rounds "
                   "is noise, not a result")
    return out


def build_tables(rows: list[Row], results: Sequence[object] = ()) -> list[Table]:
    """Every table of the report, in reading order (``results`` adds the configurations that could
    not run to the multi-worker table, with the reason)."""
    tables: list[Table] = []
    stores = sorted({r.store for r in rows if r.store != "none"}, key=lambda s: (s != "memory", s)) or ["memory"]
    for store in stores:
        sel = [r for r in rows if r.store in (store, "none")]
        for group in GROUP_TITLES:
            if group == "workers":
                continue
            grows = [r for r in sel if r.group == group]
            if not grows or all(r.library == "bare" for r in grows):
                continue
            section = _section(next(r for r in grows if r.library != "bare"))
            tables.extend(_group_tables(section, group, grows, _absent(results, group, store)))
    tables.extend(cluster_tables(rows))
    tables.extend(workers_tables(rows, results))
    return tables


def _absent(results: Sequence[object], group: str, store: str) -> list[str]:
    """``"library: reason"`` for each library that could not run a scenario of ``group`` on ``store``."""
    out: dict[str, None] = {}
    for x in results:
        if isinstance(x, Result) and x.row is None and x.skipped and x.task.scenario.group == group \
                and x.task.store == store and x.task.workers == 1:
            out[f"{x.task.library}: {' '.join(x.skipped.split())[:200]}"] = None
    return list(out)


def workers_tables(rows: list[Row], results: Sequence[object] = ()) -> list[Table]:
    """One table per multi-worker scenario: every library and store side by side, the allowed count
    next to the exact limit, with throughput and the CPU of all the server's processes."""
    wrows = [r for r in rows if r.group == "workers"]
    failed = [x for x in results if isinstance(x, Result) and x.row is None and x.skipped and x.task.workers > 1]
    tables: list[Table] = []
    keys = dict.fromkeys([r.scenario for r in wrows] + [x.task.scenario.key for x in failed])
    header = ["Library", "Store", "Workers", "Conns", "Admitted", "Exact", "Admitted ÷ exact", "429", "errors",
              "req/s", "p99 ms", "server CPU (all processes)", "server RSS", "note"]
    for sc in keys:
        body = []
        title = ""
        for r in [r for r in wrows if r.scenario == sc]:
            title = r.title
            exact = r.expected_allowed
            admitted = r.admitted if r.admitted is not None else r.allowed
            body.append([r.library if r.library != "bare" else "bare (no limiter)",
                         _STORE_NAMES.get((r.library, r.store), r.store), str(r.workers), str(r.concurrency),
                         _flag(r, _n(admitted)), str(exact) if exact is not None else "—",
                         _flag(r, f"{admitted / exact:.2f}") if exact else "—", _n(r.throttled), str(r.errors),
                         _flag(r, _n(r.rps)),
                         _ms(r.p99_ms), f"{r.cpu_pct:.0f}%" if r.cpu_pct is not None else "—",
                         f"{r.rss_mb:.0f} MB" if r.rss_mb is not None else "—", r.note])
        for x in failed:
            task = x.task
            if task.scenario.key != sc:
                continue
            title = title or task.scenario.title
            reason = " ".join(x.skipped.split())
            body.append([task.library, _STORE_NAMES.get((task.library, task.store), task.store), str(task.workers),
                         str(task.concurrency)] + ["—"] * 9 + [reason[:300]])
        tables.append(Table("live · several workers", "workers", f"{GROUP_TITLES['workers']} ({title})", header,
                            body))
    return tables


def _mix(r: Row) -> str:
    other = max(0, r.requests - r.allowed - r.throttled)
    return f"{_n(r.allowed)} / {_n(r.throttled)} / {_n(other)}"


def cluster_tables(rows: list[Row]) -> list[Table]:
    """Live Redis standalone vs Redis Cluster, side by side per workload, concurrency and library.

    Only built when the same live scenario ran on both ``redis`` and ``redis-cluster``.
    """
    live = [r for r in rows if r.driver == "live"]
    both = {r.scenario for r in live if r.store == "redis"} & {r.scenario for r in live if r.store == "redis-cluster"}
    tables: list[Table] = []
    for sc in [s for s in dict.fromkeys(r.scenario for r in live) if s in both]:
        srows = [r for r in live if r.scenario == sc]
        by = {(r.store, r.concurrency, r.library): r for r in srows}
        header = ["Conns", "Library", "standalone req/s", "p50 / p99 ms", "2xx / 429 / other", "CPU / RSS",
                  "cluster req/s", "p50 / p99 ms", "2xx / 429 / other", "CPU / RSS", "cluster ÷ standalone"]
        body = []
        for conc in sorted({r.concurrency for r in srows}):
            for lib in library_order([r.library for r in srows]):
                cells = [str(conc), lib if lib != "bare" else "bare (no limiter)"]
                pair = [by.get(("none" if lib == "bare" else store, conc, lib)) for store in ("redis", "redis-cluster")]
                if lib == "bare":
                    pair[1] = None
                if pair == [None, None]:
                    continue
                for r in pair:
                    if r is None:
                        cells += ["—"] * 4
                        continue
                    res = (f"{r.cpu_pct:.0f}%" if r.cpu_pct is not None else "—") + " / " + (
                        f"{r.rss_mb:.0f} MB" if r.rss_mb is not None else "—")
                    cells += [_flag(r, _n(r.rps) + (f" ({r.vs_bare:.2f}x bare)" if r.vs_bare and lib != "bare" else "")
                                    + (f", admitted {r.admitted_cell.lstrip('⚠ ')}" if r.over_limit else "")),
                              f"{_ms(r.p50_ms)} / {_ms(r.p99_ms)}", _mix(r), res]
                a, b = pair
                cells.append(f"{b.rps / a.rps:.2f}" if a and b and a.rps else "—")
                body.append(cells)
        title = next(r.title for r in srows)
        tables.append(Table("live · Redis standalone vs Redis Cluster (3 primaries + 3 replicas)", "cluster",
                            title, header, body))
    return tables


def _scenarios(rows: list[Row]) -> list[tuple[str, int]]:
    seen: dict[tuple[str, int], None] = {}
    for r in rows:
        seen[(r.scenario, r.concurrency)] = None
    return list(seen)


def _live_table(section: str, group: str, rows: list[Row], absent: list[str], measure: str = "") -> Table:
    """One line per live configuration: admitted against the limit first, then throughput, its
    spread over the interleaved rounds, and costs."""
    libs = library_order([r.library for r in rows])
    by = {(r.scenario, r.concurrency, r.library): r for r in rows}
    titles = {r.scenario: r.title for r in rows}
    header = ["Scenario", "Library", "Conns", "admitted / limit", "req/s", "vs bare", "exact",
              "req/s over rounds (min-max, cv)", "vs bare over rounds", "avg ms", "p50 ms", "p99 ms",
              "p99.9 ms", "2xx", "429", "errors", "server CPU", "server RSS", "cmd/req", "checks without store"]
    body = []
    for sc, conc in _scenarios(rows):
        for lib in libs:
            r = by.get((sc, conc, lib))
            if r is None:
                continue
            body.append([titles[sc], lib, str(conc), r.admitted_cell, _flag(r, _n(r.rps)), _ratio(r), r.exact_cell,
                         r.spread_cell, _flag(r, r.ratio_spread_cell) or "—",
                         _ms(r.lat_mean_ms), _ms(r.p50_ms), _ms(r.p99_ms), _ms(r.p999_ms), _n(r.allowed),
                         _n(r.throttled), str(r.errors), f"{r.cpu_pct:.0f}%" if r.cpu_pct is not None else "—",
                         f"{r.rss_mb:.0f} MB" if r.rss_mb is not None else "—",
                         f"{r.calls_per_request:.2f}" if r.calls_per_request is not None else "—",
                         r.without_store_cell or "—"])
    notes = []
    over = [r for r in rows if r.over_limit]
    if over:
        notes.append(f"⚠ {len(over)} row(s) admitted more than the limit: their req/s and ratio to no limiter "
                     "are not comparable with the rows that held it.")
    if measure == "rejected":
        notes.append("Nearly every request here is a 429, which skips the handler: a ratio above 1.00x bare is "
                     "the cost of a rejection against a served request, not overhead on served traffic.")
    elif measure == "allowed":
        notes.append("Every request is served: the ratio to no limiter is the overhead a limiter adds in "
                     "production.")
    if absent:
        notes.append("Not in this table (no such backend or mode): " + "; ".join(absent) + ".")
    title = GROUP_TITLES[group] + (f" · {MEASURES[measure]}" if group == "live" and measure else "")
    return Table(section, group, title, header, body, " ".join(notes))


def _admitted_table(section: str, group: str, rows: list[Row]) -> Table | None:
    """Admitted / limit per scenario and library (in-process rows with a known limit)."""
    known = [r for r in rows if r.limit is not None and r.library != "bare"]
    if not known:
        return None
    libs = library_order([r.library for r in known])
    by = {(r.scenario, r.concurrency, r.library): r for r in known}
    titles = {r.scenario: r.title for r in rows}
    body = [[titles[sc] + (f" (c={conc})" if conc > 1 else "")]
            + [by[(sc, conc, lib)].admitted_cell if (sc, conc, lib) in by else "—" for lib in libs]
            for sc, conc in _scenarios(known)]
    return Table(section, group, GROUP_TITLES[group] + ": admitted / limit", ["Scenario", *libs], body)


def _group_tables(section: str, group: str, rows: list[Row], absent: Sequence[str] = ()) -> list[Table]:
    """The tables of one scenario group: throughput, latency percentiles, allowed vs exact.
    Over 60 lines because the three tables share their row and column bookkeeping."""
    libs = library_order([r.library for r in rows])
    by = {(r.scenario, r.concurrency, r.library): r for r in rows}
    titles = {r.scenario: r.title for r in rows}
    keys = _scenarios(rows)
    out: list[Table] = []
    if group == "flood":
        return [_live_table(section, group, rows, list(absent))]
    if group == "live":
        kinds = sorted({r.measure for r in rows}, key=list(MEASURES).index)
        return [_live_table(section, group, [r for r in rows if r.measure == m], list(absent), m) for m in kinds]
    if group == "tiered":
        header = ["Library", "Group", "Requests", "Avg latency", "Limited", "Success rate"]
        body = []
        for lib in libs:
            for sc, conc in keys:
                r = by.get((sc, conc, lib))
                if r is None:
                    continue
                for name, g in r.groups.items():
                    body.append([lib, name, _n(g["requests"]), f"{_ms(g['avg_ms'])} ms", _n(g["limited"]),
                                 _pct(g["success_pct"])])
        return [Table(section, group, GROUP_TITLES[group], header, body)]
    if group == "correctness":
        header = ["Scenario", "Library", "Expected allowed", "Allowed", "Throttled", "Correct", "req/s"]
        body = []
        for sc, conc in keys:
            for lib in libs:
                r = by.get((sc, conc, lib))
                if r is None or lib == "bare":
                    continue
                body.append([titles[sc], lib, str(r.expected_allowed), _flag(r, _n(r.allowed)), _n(r.throttled),
                             "yes" if r.correct else "NO", _flag(r, _n(r.rps))])
        return [Table(section, group, GROUP_TITLES[group], header, body)]
    label = "Algorithm" if group == "strategy" else "Scenario"
    header = [label] + [f"{lib} req/s" for lib in libs]
    measures = {r.scenario: r.measure for r in rows}
    for kind in sorted(set(measures.values()), key=list(MEASURES).index):
        body = []
        for sc, conc in keys:
            if measures[sc] != kind:
                continue
            name = titles[sc] + (f" (c={conc})" if len({c for s, c in keys if s == sc}) > 1 else "")
            body.append([name] + [_throughput_cell(by[(sc, conc, lib)]) if (sc, conc, lib) in by else "—"
                                  for lib in libs])
        out.append(Table(section, group, f"{GROUP_TITLES[group]} · {MEASURES[kind]}", header, body))
    lat_header = [label] + [f"{lib} p50 / p95 / p99 ms" for lib in libs]
    lat_body = []
    for sc, conc in keys:
        cells = [titles[sc]]
        for lib in libs:
            r = by.get((sc, conc, lib))
            cells.append(f"{_ms(r.p50_ms)} / {_ms(r.p95_ms)} / {_ms(r.p99_ms)}" if r else "—")
        lat_body.append(cells)
    out.append(Table(section, group, GROUP_TITLES[group] + ": latency percentiles", lat_header, lat_body))
    checked = [r for r in rows if r.correct is not None and r.library != "bare"]
    if checked:
        note = []
        for lib in library_order([r.library for r in checked]):
            mine = [r for r in checked if r.library == lib]
            wrong = [f"{r.scenario} ({r.allowed} allowed, expected {r.expected_allowed})"
                     for r in mine if not r.correct]
            over = any(r.over_limit for r in mine)
            note.append([lib, f"{'⚠ ' if over else ''}{sum(1 for r in mine if r.correct)}/{len(mine)} exact",
                         "; ".join(wrong) or "all exact"])
        out.append(Table(section, group, GROUP_TITLES[group] + ": allowed count vs an exact limiter, per library",
                         ["Library", "Exact", "Deviations"], note))
    admitted = _admitted_table(section, group, rows)
    if admitted:
        out.append(admitted)
    return out


def over_limit_lines(rows: list[Row]) -> list[str]:
    """One line per row that admitted more than its limit (the reports list them first)."""
    return [f"{r.library} · {r.scenario} · {r.store} · c={r.concurrency}: admitted {r.admitted_cell.lstrip('⚠ ')} "
            f"at {_n(r.rps)} req/s" + (f" ({r.vs_bare:.2f}x bare)" if r.vs_bare else "")
            for r in rows if r.over_limit]


def _md_table(t: Table) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(t.header), "| " + " | ".join("---" for _ in t.header) + " |", *map(line, t.body)])


def render_markdown(rows: list[Row], meta: Meta, skipped: Sequence[object] = ()) -> str:
    """The whole report as Markdown: how it was made, then one table per group and section."""
    lines = ["# ratewarden bench results", "", f"- Command: `{meta.command}`", f"- Date: {meta.started}",
             f"- Machine: {meta.machine}", f"- Python {meta.python}; "
             + ", ".join(f"{k} {v}" for k, v in meta.versions.items())]
    for k, v in meta.method.items():
        lines.append(f"- {k}: {v}")
    noise = noise_lines(rows)
    if noise:
        lines += ["", "**How noisy the machine was** (the libraries of a scenario run interleaved in rounds; "
                  "the tables give each row's req/s range over them):", ""] + [f"- {line}" for line in noise]
    over = over_limit_lines(rows)
    if over:
        lines += ["", "**⚠ Admitted more than the limit** (req/s and ratios of these rows are not comparable with "
                  "rows that held the limit):", ""] + [f"- ⚠ {line}" for line in over]
    section = None
    for t in build_tables(rows, skipped):
        if t.section != section:
            section = t.section
            lines += ["", f"## {section}"]
        lines += ["", f"### {t.title}", "", _md_table(t)]
        if t.note:
            lines += ["", t.note]
    notes = [s for s in (getattr(x, "skipped", "") for x in skipped) if s]
    if notes:
        lines += ["", "## Skipped", ""]
        for x in skipped:
            reason = getattr(x, "skipped", "")
            task = getattr(x, "task", None)
            if reason and task is not None:
                lines.append(f"- {task.library} · {task.scenario.key} · {task.store}: {reason}")
    return "\n".join(lines) + "\n"
