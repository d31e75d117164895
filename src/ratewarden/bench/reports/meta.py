"""What a report says about how it was produced: command, machine, versions."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

__all__ = ["Meta", "collect_meta"]

_PACKAGES = ("ratewarden", "traffik", "slowapi", "limits", "fastapi", "starlette", "uvicorn", "uvloop",
             "httptools", "redis")


@dataclass
class Meta:
    command: str
    started: str = ""
    python: str = ""
    machine: str = ""
    cpus: int = 0
    compiled: bool = False  # ratewarden's hot path ran mypyc-compiled (ratewarden.COMPILED)
    versions: dict[str, str] = field(default_factory=dict)
    method: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or platform.machine()
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def collect_meta(command: str, method: dict[str, Any]) -> Meta:
    import ratewarden

    versions: dict[str, str] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    # The build that actually ran (a compiled tree on PYTHONPATH may differ from the installed one).
    versions["ratewarden"] = f"{ratewarden.__version__} ({ratewarden.build_description()})"
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = 0.0
    return Meta(
        command=command,
        started=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        python=platform.python_version(),
        machine=f"{_cpu_model()}, {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, {platform.system()} {platform.release()}",
        cpus=os.cpu_count() or 0,
        compiled=ratewarden.COMPILED,
        versions=versions,
        method=method,
    )
