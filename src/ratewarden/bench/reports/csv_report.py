"""``summary.csv``: one row per library x scenario x store x driver x concurrency (the median run)."""

from __future__ import annotations

import csv
import json
from dataclasses import fields
from pathlib import Path

from ..results import Row

COLUMNS = [f.name for f in fields(Row)]


def write_csv(path: Path, rows: list[Row]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            d = row.to_dict()
            d["rps_runs"] = ";".join(f"{v:.1f}" for v in row.rps_runs)
            d["groups"] = json.dumps(row.groups) if row.groups else ""
            d["without_store"] = json.dumps(row.without_store) if row.without_store else ""
            for key in ("rps", "success_pct", "throttled_pct", "lat_mean_ms", "p50_ms", "p95_ms", "p99_ms",
                        "p999_ms", "cpu_pct", "rss_mb", "calls_per_request", "vs_bare", "rps_min", "rps_max",
                        "rps_cv_pct", "vs_bare_min", "vs_bare_max"):
                if isinstance(d[key], float):
                    d[key] = round(d[key], 4)
            writer.writerow(d)
    return path
