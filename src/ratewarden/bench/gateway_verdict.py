"""The gateway report's verdict against each peer (``verdicts``): HAProxy's own limiting, nginx's
``limit_req`` and envoyproxy/ratelimit, each compared with ratewarden's rows on the same load, round
by round, as ours ÷ theirs; who wins, by how much, on which row, at what load and noise, and
whether both are exact."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .gateway_figures import HIGHER, LOWER, NOISE, Spread, paired, winner
from .gateway_peer_rows import EXACT_CALLS, EXACT_LIMIT, PeerRow
from .gateway_rows import GatewayReport, VariantRow

__all__ = ["Comparison", "PeerVerdict", "machine_noise", "verdicts"]

#: The gateways' peers: their own limiting, and ratewarden's rows through the same gateway.
GATEWAY_PEERS = (("HAProxy", "haproxy-native", ("haproxy-spoe-compiled", "haproxy-spoe", "haproxy-ratewarden")),
                 ("nginx", "nginx-limit_req", ("nginx-ratewarden",)))
REFERENCE = "envoyproxy/ratelimit"
#: The envoyproxy/ratelimit row a verdict leads with, best first: the compiled front door, one worker,
#: Redis, under the limit (every call a full decision), one connection.
HEADLINE_CELLS = (("front", "redis", "under", 1, 1), ("front", "redis", "over", 1, 1),
                  ("python", "redis", "under", 1, 1))


@dataclass(frozen=True)
class Comparison:
    """One of our rows against the peer's on one metric: both figures and ours ÷ theirs by round."""

    ours_row: str
    peer_row: str
    metric: str
    direction: str
    unit: str
    digits: int
    ours: Spread | None
    theirs: Spread | None
    ratio: Spread | None
    where: str = ""

    @property
    def winner(self) -> str:
        return winner(self.ratio, self.direction)


@dataclass
class PeerVerdict:
    """The verdict against one peer, and every comparison it was drawn from."""

    peer: str
    peer_row: str = ""
    comparisons: list[Comparison] = field(default_factory=list)
    headline: list[Comparison] = field(default_factory=list)
    load: str = ""
    noise: str = ""
    exact: str = ""
    missing: str = ""

    def others(self) -> str:
        """The headline metric on every other row: the range of their medians."""
        if not self.headline:
            return ""
        head = self.headline[0]
        rest = [c.ratio.median for c in self.comparisons if c.metric == head.metric and c.ratio is not None
                and (c.ours_row, c.where) != (head.ours_row, head.where)]
        if not rest:
            return ""
        span = f"{min(rest):.2f}x" if len(rest) == 1 else f"{min(rest):.2f}x to {max(rest):.2f}x"
        return f" The other {len(rest)} row{'s' if len(rest) > 1 else ''} of ours: {head.metric} {span} (medians)."

    def outcome(self) -> str:
        """``ratewarden wins`` / ``HAProxy wins`` / ``within noise`` / ``no verdict`` on the headline metric."""
        if not self.headline or self.headline[0].ratio is None:
            return "no verdict"
        return {"ours": "ratewarden wins", "theirs": f"{self.peer} wins", NOISE: f"neither wins ({NOISE})"}.get(
            self.headline[0].winner, "no verdict")

    def sentence(self) -> str:
        """The verdict in one paragraph: who wins, by how much, on which row, load, noise, exactness."""
        if not self.headline or self.headline[0].ratio is None:
            return f"{self.peer}: no verdict: {self.missing or 'no rounds to compare'}."
        head = self.headline[0]
        figures = "; ".join(f"{c.metric} {_ratio_text(c)}" for c in self.headline)
        return (f"{self.peer}: {self.outcome()} on {head.metric}: ours ÷ {self.peer} "
                f"{figures}. Row: {head.ours_row} against {head.peer_row}{f' ({head.where})' if head.where else ''}. "
                f"Load: {self.load}. Noise: {self.noise}. Exact: {self.exact}.{self.others()}")


def _ratio_text(c: Comparison) -> str:
    if c.ratio is None:
        return "n/a"
    rounds = f" over {c.ratio.rounds} rounds" if c.ratio.rounds > 1 else " (1 round)"
    return c.ratio.text(2, "x") + rounds


def machine_noise(report: GatewayReport) -> str:
    """The load average at the start and the end, from the run's ``load`` line, shortened."""
    line = str(report.meta.get("load", ""))
    got = re.search(r"([\d.]+)/[\d./]+ at the start, ([\d.]+)/[\d./]+ at the end, on (\d+) cores", line)
    if not got:
        return "machine load not recorded"
    busy = " (busier than its cores)" if "above the core count" in line else ""
    return f"load average {got.group(1)} → {got.group(2)} on {got.group(3)} cores{busy}"


def _exact_text(v: VariantRow) -> str:
    """``yes (standard 720 / 720, basic 360 / 360)``: the verdict and the groups that reached their limit."""
    groups = v.groups()
    worst = max((g.exact for g in groups), key=lambda e: {"⚠ over": 4, "NO": 3, "within": 2, "yes": 1}.get(e, 0))
    reached = [f"{g.group} {g.admitted:,} / {g.limit:,}" for g in groups if g.limit is not None
               and g.expected == g.limit]
    return worst + (f" ({', '.join(reached)})" if reached else "")


def _gateway_verdict(report: GatewayReport, peer: str, peer_key: str, ours_keys: tuple[str, ...],
                     noise: str) -> PeerVerdict:
    theirs = report.variant(peer_key)
    verdict = PeerVerdict(peer, theirs.title if theirs else peer_key, noise=noise)
    o = report.options
    pace = f"paced to {o.get('rate', 0):g} req/s" if o.get("rate") else "closed loop"
    verdict.load = (f"{o.get('requests')} requests per round {pace}, {o.get('workers')} keep-alive workers, "
                    f"{o.get('keys_per_group')} fresh key{'s' if o.get('keys_per_group') != 1 else ''} per group")
    ours_rows = [v for v in (report.variant(k) for k in ours_keys) if v is not None]
    if theirs is None or not ours_rows:
        missing = [v for v in report.variants if v.key in (peer_key, *ours_keys) and v.missing]
        verdict.missing = "; ".join(f"{v.title}: {v.missing}" for v in missing) or "the rows did not run"
        return verdict
    for v in ours_rows:
        for metric, what in (("average latency", "mean"), ("p99", "p99")):
            verdict.comparisons.append(Comparison(v.title, theirs.title, metric, LOWER, " ms", 2, v.spread(what),
                                                  theirs.spread(what), Spread.of(paired(v.by_round(what),
                                                                                        theirs.by_round(what)))))
    best = min(ours_rows, key=lambda v: _median(verdict, v.title, "average latency"))
    verdict.headline = [c for c in verdict.comparisons if c.ours_row == best.title]
    verdict.exact = f"ours {_exact_text(best)}; {peer} {_exact_text(theirs)}"
    return verdict


def _median(verdict: PeerVerdict, row: str, metric: str) -> float:
    c = next(c for c in verdict.comparisons if c.ours_row == row and c.metric == metric)
    return c.ratio.median if c.ratio else float("inf")


def _cell(p: PeerRow) -> str:
    return f"{p.store}, {p.scenario} the limit, {p.connections} connection{'s' if p.connections > 1 else ''}"


def _envoy_verdict(report: GatewayReport, noise: str) -> PeerVerdict:
    verdict = PeerVerdict(REFERENCE, REFERENCE, noise=noise)
    rows = report.peers
    refs = [p for p in rows if p.service == "reference" and p.rounds]
    if not refs:
        verdict.missing = next((p.missing for p in rows if p.service == "reference" and p.missing), "") \
            or "the reference did not run"
        return verdict
    for p in rows:
        ref = next((r for r in refs if r.same_cell(p)), None)
        if p.service == "reference" or ref is None or not p.rounds:
            continue
        for metric, what, direction, unit, digits in (("req/s", "rps", HIGHER, "", 0),
                                                      ("CPU per decision", "cpu_us", LOWER, " µs", 1),
                                                      ("p99", "p99_ms", LOWER, " ms", 2)):
            verdict.comparisons.append(Comparison(
                p.title, ref.title, metric, direction, unit, digits, p.spread(what),
                ref.spread(what),
                Spread.of(paired(p.by_round(what), ref.by_round(what))), _cell(p)))
    head = next((p for cell in HEADLINE_CELLS for p in rows if p.rounds and
                 (p.service, p.store, p.scenario, p.workers, p.connections) == cell), None)
    if head is None or not verdict.comparisons:
        verdict.missing = "no ratewarden row ran beside the reference"
        return verdict
    verdict.headline = [c for c in verdict.comparisons if c.ours_row == head.title and c.where == _cell(head)
                        and c.metric in ("req/s", "CPU per decision")]
    o = report.options
    verdict.load = (f"ghz, {o.get('peer_requests', 0):,} calls per cell, 50 streams per connection, "
                    f"{len(head.rounds)} rounds")
    ref_head = next(r for r in refs if r.same_cell(head))
    verdict.exact = (f"ours {head.exact} ({'/'.join(map(str, sorted(set(head.admitted))))} / {EXACT_LIMIT} of "
                     f"{EXACT_CALLS} calls); {REFERENCE} {ref_head.exact} "
                     f"({'/'.join(map(str, sorted(set(ref_head.admitted))))} / {EXACT_LIMIT})")
    return verdict


def verdicts(report: GatewayReport) -> list[PeerVerdict]:
    """One verdict per peer that was part of the run (a peer asked for but missing says why)."""
    noise = machine_noise(report)
    out = [_gateway_verdict(report, peer, key, ours, noise) for peer, key, ours in GATEWAY_PEERS
           if any(v.key in (key, *ours) for v in report.variants)]
    if report.peers:
        out.append(_envoy_verdict(report, noise))
    return out
