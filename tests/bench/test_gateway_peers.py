"""``ratewarden bench --gateway``'s gRPC rows beside envoyproxy/ratelimit (bench.gateway_peers): the
quickest real run (ghz, the reference, redis-server and ``ratewarden serve`` on loopback) with its row
set, exactness and report files (never a timing); and a machine without Go, whose report says why the
peers were skipped instead of failing."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from ratewarden.bench.gateway_peer_rows import EXACT_LIMIT
from ratewarden.bench.gateway_peers import INSTANCES
from ratewarden.cli import main

GO_TOOLS = ("go", "ghz", "service_cmd")


def _go_binary(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for p in (Path(os.environ.get("GOBIN", "/nonexistent")) / name,
                                                        Path.home() / "go" / "bin" / name) if os.access(p, os.X_OK)), None)


def _peers_only(out: Path) -> int:
    return main(["bench", "--gateway", "--peers-only", "--quick", "--peer-requests", "200", "--peer-rounds", "1",
                 "--out", str(out)])


EXPECTED = [(i.service, i.store, s, i.workers, c) for i in INSTANCES for s, c in i.cells]


def test_the_quickest_run_has_every_row_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("grpc")
    pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
    if not all(_go_binary(b) for b in ("ghz", "service_cmd")) or shutil.which("redis-server") is None:
        pytest.skip("needs ghz and service_cmd built (go install, see docs/benchmarks.md) and redis-server")
    assert _peers_only(tmp_path) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    peers = data["peers"]
    assert [(p["service"], p["store"], p["scenario"], p["workers"], p["connections"]) for p in peers] == EXPECTED
    assert {p["service"] for p in peers} == {"python", "front", "front-same", "reference", "floor"}
    assert {(p["store"], p["workers"]) for p in peers if p["service"] == "front"} == {("redis", 1), ("redis", 2)}
    assert {p["store"] for p in peers if p["service"] == "front-same"} == {"redis", "memory"}
    compiled = any("compiled front door" in n for n in data["peer_notes"])
    for p in peers:
        if p["service"] in ("front", "front-same", "floor") and not compiled:
            assert p["missing"], p  # skipped, with the reason
            continue
        assert p["missing"] == "", (p["key"], p["missing"])
        assert len(p["rounds"]) == 1 and p["rounds"][0]["requests"] == 200 and p["rounds"][0]["errors"] == {}
        if p["service"] == "floor":  # it limits nothing: no exactness check
            assert p["admitted"] == [] and p["exact"] == "—", p["key"]
        else:
            assert p["admitted"] == [EXACT_LIMIT] and p["exact"] == "yes", p["key"]
        assert (p["rounds"][0]["redis_cpu_us"] is None) == (p["store"] != "redis")
        ratios = p["vs_reference"]["rps"]  # the reference under the same load, on its Redis
        assert len(ratios) == (0 if p["service"] == "reference" else 1), p["key"]
    if compiled:  # every target is there, each req/s one read beside the floor, which answers at once
        grpc = [t for t in data["targets"] if t["target"].startswith("gRPC vs")]
        assert len(grpc) == 7, [t["target"] for t in grpc]
        assert all(t["floor"] is not None for t in grpc if t["target"].rsplit(": ", 1)[-1].startswith("req/s"))
    exact = [t for t in data["targets"] if t["target"].startswith("gRPC rows exact")]
    assert exact and exact[0]["met"] == "yes"
    with (tmp_path / "peers.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["key"] for r in rows] == [p["key"] for p in peers]
    md = (tmp_path / "report.md").read_text()
    assert "## gRPC beside envoyproxy/ratelimit" in md and md.count("| envoyproxy/ratelimit | redis |") == 3
    assert "gRPC beside envoyproxy/ratelimit" in (tmp_path / "report.html").read_text()
    assert "envoyproxy/ratelimit" in capsys.readouterr().out


def test_without_go_the_report_says_why_the_peers_were_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("grpc")
    pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.access(Path(d) / t, os.X_OK) for t in GO_TOOLS)]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/go/bin with binaries cached by an earlier build
    monkeypatch.delenv("GOBIN", raising=False)
    assert shutil.which("go") is None
    assert _peers_only(tmp_path / "out") == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [(p["service"], p["store"], p["scenario"], p["workers"], p["connections"]) for p in data["peers"]] == EXPECTED
    for p in data["peers"]:
        assert p["rounds"] == [] and "Go is not installed" in p["missing"], p
    assert any("Go is not installed" in n and "ghz" in n for n in data["peer_notes"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "MISSING: no load generator: ghz is not built and Go is not installed" in md
    assert "Traceback" not in capsys.readouterr().err


def test_ratios_are_taken_within_a_round_and_exactness_flags_each_way() -> None:
    from ratewarden.bench.gateway_peer_rows import PeerRound, PeerRow, peer_targets, vs_reference

    def rnd(r: int, rps: float, cpu: float) -> PeerRound:
        return PeerRound(r, 1000, rps, 1.0, 2.0, cpu, 10.0)

    front = PeerRow("front-same", "redis", "under", 1, 1, [rnd(0, 100, 50), rnd(1, 300, 60)], [50, 50])
    ref = PeerRow("reference", "redis", "under", 1, 1, [rnd(1, 200, 40), rnd(0, 400, 100)], [50, 51])
    other_load = PeerRow("reference", "redis", "under", 1, 4, [rnd(0, 1, 1)], [49])
    floor = PeerRow("floor", "none", "under", 1, 1, [rnd(0, 800, 20), rnd(1, 600, 30)])
    memory = PeerRow("front-same", "memory", "under", 1, 1, [rnd(0, 1000, 30), rnd(1, 400, 30)], [50, 50])
    rows = [front, ref, other_load, floor, memory]
    assert vs_reference(rows, front, "rps") == [0.25, 1.5]  # round 0 with round 0, round 1 with round 1
    assert vs_reference(rows, front, "cpu_us") == [0.5, 1.5]
    assert vs_reference(rows, ref, "rps") == []
    assert vs_reference(rows, memory, "rps") == [2.5, 2.0]  # the reference under the same load, on Redis
    assert (front.exact, ref.exact, other_load.exact, floor.exact) == ("yes", "⚠ over", "NO", "—")
    targets = {t["target"].split(" (", 1)[1]: t for t in peer_targets(rows)}
    rps = targets["redis, under the limit, 1 connection, the same answers): req/s"]
    # ours ÷ reference, higher is better: the median of 0.25 and 1.5, and its range; the floor's 2.0 and 3.0
    assert (rps["ours"], rps["ours_min"], rps["ours_max"]) == pytest.approx((0.875, 0.25, 1.5))
    assert (rps["floor"], rps["floor_min"], rps["floor_max"]) == pytest.approx((2.5, 2.0, 3.0))
    assert rps["direction"] == "higher" and rps["target_value"] == 1.5 and rps["met"] == "NO"
    cpu = targets["redis, under the limit, 1 connection, the same answers): CPU per decision"]
    assert cpu["ours"] == pytest.approx(1.0) and cpu["target_value"] == 0.5 and cpu["met"] == "NO"
    assert targets["redis, under the limit, 1 connection, the same answers): Redis CPU per decision"]["floor"] is None
    on_memory = targets["memory, under the limit, 1 connection, the same answers): req/s (the reference on Redis)"]
    assert on_memory["ours"] == pytest.approx(2.25) and on_memory["target_value"] == 2.5 and on_memory["met"] == "NO"
    assert targets["ratewarden and the reference)"]["met"] == "NO"


def test_a_failed_go_install_is_the_skip_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Go present, the module proxy out of reach (``GOPROXY=off``): the build's error is the reason."""
    pytest.importorskip("grpc")
    pytest.importorskip("envoy.service.ratelimit.v3.rls_pb2")
    if shutil.which("go") is None:
        pytest.skip("needs Go")
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not any(os.access(Path(d) / t, os.X_OK) for t in ("ghz", "service_cmd"))]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GOPATH", str(tmp_path / "gopath"))
    monkeypatch.setenv("GOPROXY", "off")
    monkeypatch.delenv("GOBIN", raising=False)
    assert _peers_only(tmp_path / "out") == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert all(p["rounds"] == [] for p in data["peers"])
    reason = data["peers"][0]["missing"]
    assert "`go install github.com/bojand/ghz/cmd/ghz@latest` failed" in reason and "GOPROXY" in reason, reason
