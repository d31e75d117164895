"""Percentile maths and median-run selection."""

from __future__ import annotations

import pytest

from ratewarden.bench.results import Run, median_run, percentile, summarize_latencies


def run(requests: int, seconds: float) -> Run:
    return Run(requests=requests, duration_s=seconds, status={"200": requests}, latency_ms={})


def test_nearest_rank_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 99.9) == 100.0
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 100.0


def test_nearest_rank_on_small_samples_takes_an_observed_value() -> None:
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 50) == 20.0  # rank ceil(0.5*4) = 2
    assert percentile(values, 51) == 30.0
    assert percentile(values, 99) == 40.0
    assert percentile([], 50) == 0.0
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_summary_fields() -> None:
    s = summarize_latencies([3.0, 1.0, 2.0])
    assert s["mean"] == pytest.approx(2.0)
    assert s["p50"] == 2.0 and s["p99"] == 3.0 and s["max"] == 3.0


def test_median_run_is_selected_by_requests_per_second_not_by_request_count() -> None:
    slow = run(1000, 2.0)   # 500 req/s, most requests
    mid = run(300, 0.5)     # 600 req/s
    fast = run(100, 0.1)    # 1000 req/s
    assert median_run([fast, slow, mid]) is mid


def test_median_of_an_even_count_is_the_upper_middle() -> None:
    runs = [run(100, 1.0), run(200, 1.0), run(300, 1.0), run(400, 1.0)]
    assert median_run(runs).rps == 300
    with pytest.raises(ValueError):
        median_run([])


def test_allowed_and_throttled_counts() -> None:
    r = Run(requests=10, duration_s=1, status={"200": 6, "429": 3, "500": 1}, latency_ms={})
    assert (r.allowed, r.throttled) == (6, 3)
    live = Run(requests=5, duration_s=1, status={"2xx": 4, "429": 1}, latency_ms={})
    assert (live.allowed, live.throttled) == (4, 1)
