"""The gateway report's sections in reading order, said once for both of its renderings (the page,
``gateway_html.html``, and the Markdown, ``gateway_report.markdown``): the verdict against each peer,
each peer's comparison, the targets, the details and the method."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .gateway_peer_report import peer_method, peer_table
from .gateway_rows import GatewayReport
from .gateway_tables import (
    capacity_table,
    comparison_table,
    group_table,
    meta_lines,
    method,
    reading,
    target_table,
    variant_table,
)
from .gateway_verdict import PeerVerdict, verdicts

__all__ = ["Section", "sections"]


@dataclass(frozen=True)
class Section:
    """One section as it reads: its heading, then a paragraph, a list, a chart (the page's only) and a
    table, each left out when empty. Text is plain but for `code` in backquotes, as in Markdown."""

    heading: str
    text: str = ""
    notes: Sequence[str] = ()
    rows: list[list[str]] = field(default_factory=list)
    chart: str = ""
    level: int = 2  #: 2 for a section, 3 for one within the section before it
    name: str = ""  #: the page's id for the section and class for its list


def sections(report: GatewayReport,
             chart: Callable[[GatewayReport, PeerVerdict], str] | None = None) -> list[Section]:
    """The sections under the report's title; ``chart`` draws a peer's chart (the page has them, the
    Markdown does not), and a peer with a chart or a comparison has a section of its own."""
    found = verdicts(report)
    out = [Section("Verdict", reading(), [v.sentence() for v in found], name="verdict")]
    for v in found:
        drawn = chart(report, v) if chart else ""
        if drawn or v.comparisons:
            out.append(Section(f"Against {v.peer}", rows=comparison_table(v) if v.comparisons else [], chart=drawn))
    if report.targets:
        out.append(Section("Targets", rows=target_table(report.targets)))
    if report.variants:
        over = ", ".join(v.title for v in report.variants if v.over_limit)
        out.append(Section("Latency through the gateway", f"⚠ over the limit: {over}" if over else "",
                           rows=variant_table(report)))
        out += [Section(f"{row.title} (`{row.key}`), summed over {len(row.rounds)} rounds", rows=group_table(row),
                        level=3) for row in report.variants if row.rounds]
    if report.capacity:
        out.append(Section("Service capacity", rows=capacity_table(report)))
    if report.peers:
        out.append(Section("gRPC beside envoyproxy/ratelimit", peer_method(report), report.peer_notes,
                           peer_table(report)))
    out.append(Section("Method", method(report), meta_lines(report), name="method"))
    return out
