"""JSON output: ``results.json`` (all rows and runs) and one file per configuration under ``runs/``."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..runner import Result
from .meta import Meta


def _result_dict(r: Result) -> dict[str, Any]:
    return {
        "library": r.task.library, "scenario": r.task.scenario.key, "store": r.task.store,
        "concurrency": r.task.concurrency, "skipped": r.skipped,
        "summary": r.row.to_dict() if r.row else None,
        "runs": [asdict(run) | {"rps": run.rps} for run in r.runs],
    }


def write_json(out: Path, results: list[Result], meta: Meta) -> list[Path]:
    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in results:
        if not r.runs:
            continue
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{r.task.library}__{r.task.scenario.key}__{r.task.store}"
                      f"__c{r.task.concurrency}") + ".json"
        p = runs_dir / name
        p.write_text(json.dumps(_result_dict(r), indent=1), encoding="utf-8")
        paths.append(p)
    main = out / "results.json"
    main.write_text(json.dumps({"meta": meta.to_dict(), "results": [_result_dict(r) for r in results]}, indent=1),
                    encoding="utf-8")
    paths.insert(0, main)
    return paths
