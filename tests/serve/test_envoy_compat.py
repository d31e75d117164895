"""The options that make ``ratewarden serve`` answer as envoyproxy/ratelimit does (docs/gateways/envoy.md,
"Compatibility with envoyproxy/ratelimit"), each through the generated Envoy client on a real gRPC
server: ``charge="each"``, ``headers="reference"``/``"none"``, merged domains, and ``quota_mode``
(the reference's ``example.yaml``); their bad values; and the command-line flags end to end. Then
scripts/envoy_compat.py against the reference binary at ``REFERENCE_VERSION`` and its fixtures at that
commit: ``--envoy-env`` answers as the reference but for the kept error codes, and the counts are the docs'."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]

from ratewarden.bench.services import free_port
from ratewarden.errors import ConfigurationError
from ratewarden.limiter import Limiter
from ratewarden.serve.envoy_config import EnvoyConfigError, load_envoy_configs, parse_envoy_config
from ratewarden.serve.grpc import start_grpc
from ratewarden.serve.rls import RateLimitService
from ratewarden.stores import MemoryStore, RedisStore, Store

from .reference_fixtures import EXAMPLE_YAML, MERGE_DOMAIN_KEY1, MERGE_DOMAIN_KEY2
from .test_grpc import OK, OVER, Rls, desc, frozen
from .test_serve_cli import Serve

CONFIG = """\
domain: compat
descriptors:
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: watched
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"""
REFERENCE_NAMES = ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"]


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> Callable[[], Store]:
    if request.param == "memory":
        return lambda: MemoryStore(clock=frozen)
    url = request.getfixturevalue("redis_standalone").url
    return lambda: RedisStore(url, clock=frozen)


@asynccontextmanager
async def serving(store: Store, *texts: str, **options: Any) -> AsyncIterator[Rls]:
    domains = {d.domain: d for d in (parse_envoy_config(text) for text in texts)}
    limiter = Limiter(store, prefix=f"t{uuid.uuid4().hex[:12]}")
    service = RateLimitService(domains, limiter, **options)
    server, port = await start_grpc(service, "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Rls(service, rls_pb2_grpc.RateLimitServiceStub(channel))
    finally:
        await channel.close()
        await server.stop(None)
        await limiter.close()


def headers_of(answer: Any) -> dict[str, str]:
    return {h.key: h.value for h in answer.response_headers_to_add}


@pytest.mark.parametrize(("charge", "big_left", "small_then"), [("all", 10, OK), ("each", 7, OVER)])
async def test_charge_each_counts_a_refused_request_as_the_reference_does(
    make_store: Callable[[], Store], charge: str, big_left: int, small_then: int
) -> None:
    """A cost of 3 against 2 left is refused: all or nothing charges neither limit; ``each`` charges
    both, the refused one up to its limit (so the next unit is refused too, as in the reference)."""
    async with serving(make_store(), CONFIG, charge=charge) as rls:
        refused = await rls.call("compat", desc(("small", "a")), desc(("big", "a")), hits=3)
        assert refused.overall_code == OVER
        assert [s.code for s in refused.statuses] == [OVER, OK]
        assert refused.statuses[0].limit_remaining == (0 if charge == "each" else 2)
        big = await rls.call("compat", desc(("big", "a"), hits=0))
        assert big.statuses[0].limit_remaining == big_left
        assert (await rls.call("compat", desc(("small", "a")))).overall_code == small_then


async def test_charge_each_a_zero_limit_does_not_spare_the_others(make_store: Callable[[], Store]) -> None:
    for charge, left in (("all", 10), ("each", 9)):
        async with serving(make_store(), CONFIG, charge=charge) as rls:
            answer = await rls.call("compat", desc(("blocked", "a")), desc(("big", "a")))
            assert answer.overall_code == OVER and [s.code for s in answer.statuses] == [OVER, OK]
            assert (await rls.call("compat", desc(("big", "a"), hits=0))).statuses[0].limit_remaining == left, charge


async def test_headers_reference_none_and_ratewarden(make_store: Callable[[], Store]) -> None:
    async with serving(make_store(), CONFIG, headers="reference") as rls:
        answer = await rls.call("compat", desc(("big", "a")), desc(("small", "a")))
        names = [h.key for h in answer.response_headers_to_add]
        assert names == REFERENCE_NAMES
        sent = headers_of(answer)
        assert (sent["RateLimit-Limit"], sent["RateLimit-Remaining"]) == ("2", "1")  # the closest to its limit
        assert 1 <= int(sent["RateLimit-Reset"]) <= 60
        # the reference sends them for a shadow limit and a limit of 0 too
        shadow = headers_of(await rls.call("compat", desc(("watched", "a")), hits=2))
        assert (shadow["RateLimit-Limit"], shadow["RateLimit-Remaining"]) == ("1", "1")
        zero = headers_of(await rls.call("compat", desc(("blocked", "a"))))
        assert (zero["RateLimit-Limit"], zero["RateLimit-Remaining"]) == ("0", "0")
    async with serving(make_store(), CONFIG, headers="reference", charge="each") as rls:
        # over: the refused descriptor's, even after one with as little left
        over = headers_of(await rls.call("compat", desc(("big", "b"), hits=10), desc(("small", "a"), hits=3)))
        assert (over["RateLimit-Limit"], over["RateLimit-Remaining"]) == ("2", "0")
    async with serving(make_store(), CONFIG, headers="none") as rls:
        answer = await rls.call("compat", desc(("small", "a")), hits=5)
        assert answer.overall_code == OVER and list(answer.response_headers_to_add) == []
    async with serving(make_store(), CONFIG) as rls:
        sent = headers_of(await rls.call("compat", desc(("small", "a"))))
        assert {"ratelimit", "ratelimit-policy", "x-ratelimit-limit"} <= set(sent)
        assert headers_of(await rls.call("compat", desc(("watched", "a")))) == {}  # shadow only: none


async def test_quota_mode_of_the_references_example_yaml(make_store: Callable[[], Store]) -> None:
    """``example.yaml``'s quota descriptors (service_1: 1/minute, service_2: 2/minute): each counted and
    reported on its own; the request is refused only when every quota descriptor is over."""
    both = (desc(("service", "service_1")), desc(("service", "service_2")))
    async with serving(make_store(), EXAMPLE_YAML) as rls:
        first = await rls.call("rl", *both)
        assert first.overall_code == OK and [s.limit_remaining for s in first.statuses] == [0, 1]
        second = await rls.call("rl", *both)
        assert second.overall_code == OK and [s.code for s in second.statuses] == [OVER, OK]
        assert second.statuses[0].duration_until_reset.seconds > 0
        third = await rls.call("rl", *both)
        assert third.overall_code == OVER and [s.code for s in third.statuses] == [OVER, OVER]
        alone = await rls.call("rl", desc(("service", "service_1")), desc(("foo", "x")))
        assert alone.overall_code == OVER  # its only quota descriptor is over


async def test_merged_domains_are_served_as_one(tmp_path: Path) -> None:
    (tmp_path / "merge_domain_key1.yaml").write_text(MERGE_DOMAIN_KEY1)
    (tmp_path / "merge_domain_key2.yaml").write_text(MERGE_DOMAIN_KEY2)
    with pytest.raises(EnvoyConfigError, match="duplicate domain 'test-domain'"):
        load_envoy_configs([tmp_path])
    domains = load_envoy_configs([tmp_path], merge=True)
    limiter = Limiter(MemoryStore(clock=frozen))
    server, port = await start_grpc(RateLimitService(domains, limiter), "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            rls = Rls(None, rls_pb2_grpc.RateLimitServiceStub(channel))  # type: ignore[arg-type]
            answer = await rls.call("test-domain", desc(("key1", "value1")), desc(("key2", "value2")))
            assert [s.current_limit.requests_per_unit for s in answer.statuses] == [10, 20]
            assert [s.limit_remaining for s in answer.statuses] == [9, 19]
    finally:
        await server.stop(None)


def test_merging_a_descriptor_defined_twice_names_both_files(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(MERGE_DOMAIN_KEY1)
    (tmp_path / "b.yaml").write_text(MERGE_DOMAIN_KEY1.replace("10", "11"))
    with pytest.raises(EnvoyConfigError) as error:
        load_envoy_configs([tmp_path], merge=True)
    assert "duplicate descriptor composite key 'test-domain.key1_value1'" in str(error.value)
    assert "a.yaml" in str(error.value) and "b.yaml" in str(error.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [({"headers": "envoy"}, "headers must be one of ratewarden, reference, none, got 'envoy'"),
     ({"charge": "some"}, "charge must be 'all'"), ({"headers": 1}, "headers must be one of")],
)
def test_bad_option_values_name_the_option(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named):
        RateLimitService({}, Limiter(MemoryStore()), **options)


def test_the_flags_end_to_end(tmp_path: Path) -> None:
    """``ratewarden serve`` with the three flags: merged files, the reference's headers, each charged;
    a bad value exits 2 naming the flag."""
    config = tmp_path / "envoy"
    config.mkdir()
    (config / "merge_domain_key1.yaml").write_text(MERGE_DOMAIN_KEY1.replace("10", "1"))
    (config / "merge_domain_key2.yaml").write_text(MERGE_DOMAIN_KEY2)
    argv = [sys.executable, "-m", "ratewarden.cli", "serve", str(config), "--http", f"127.0.0.1:{free_port()}"]
    bad = subprocess.run([*argv, "--envoy-headers", "envoy"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--envoy-headers" in bad.stderr and "invalid choice" in bad.stderr
    duplicate = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert duplicate.returncode == 2 and "duplicate domain 'test-domain'" in duplicate.stderr
    grpc_port = free_port()
    server = Serve(tmp_path, str(config), "--grpc", f"127.0.0.1:{grpc_port}", "--envoy-merge-domains",
                   "--envoy-headers", "reference", "--envoy-charge", "each").ready()
    try:
        pair = rls_pb2.RateLimitRequest(domain="test-domain", descriptors=[desc(("key1", "value1")), desc(("key2", "value2"))])
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            assert stub.ShouldRateLimit(pair, timeout=10).overall_code == OK
            refused = stub.ShouldRateLimit(pair, timeout=10)
        assert refused.overall_code == OVER
        assert [s.limit_remaining for s in refused.statuses] == [0, 18]  # the refused request charged key2
        assert [h.key for h in refused.response_headers_to_add] == REFERENCE_NAMES
    finally:
        assert server.stop() == 0


# ---------------------------------------------------------------- the reference's fixtures, pinned

ROOT = Path(__file__).resolve().parents[2]
#: The requests ratewarden answers otherwise on purpose, and the row of docs/gateways/envoy.md's
#: compatibility table that lists each, with the reason.
KEPT_ROWS = {
    "empty domain": "| empty `domain`, no `descriptors` |",
    "no descriptors": "| empty `domain`, no `descriptors` |",
    "an entry with an empty key": "| an entry with an empty `key`, a descriptor with no entries |",
    "a descriptor with no entries": "| an entry with an empty `key`, a descriptor with no entries |",
}


def _compat_section() -> str:
    page = (ROOT / "docs" / "gateways" / "envoy.md").read_text()
    return page[page.index("## Compatibility with envoyproxy/ratelimit"):page.index("## Moving from envoyproxy/ratelimit")]


@pytest.fixture(scope="module")
def pinned_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """scripts/envoy_compat.py with ratewarden's defaults and ``--envoy-env``, against the reference binary
    at ``REFERENCE_VERSION`` and its fixtures at that commit (Go's module cache); skipped, with the
    reason, where Go, the binary at that version or redis-server is missing."""
    from ratewarden.bench.gateway_peers import REFERENCE_MODULE, REFERENCE_VERSION, _go_tool

    if shutil.which("go") is None:
        pytest.skip(f"no `go` on PATH: the fixtures are read from envoyproxy/ratelimit@{REFERENCE_VERSION} in Go's module cache")
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server is not installed (scripts/install-system-deps.sh)")
    found, why = _go_tool("service_cmd", REFERENCE_MODULE, False, lambda _: None, REFERENCE_VERSION)
    if not found:
        pytest.skip(f"envoyproxy/ratelimit at {REFERENCE_VERSION} is not built here: {why}")
    out = tmp_path_factory.mktemp("compat") / "compat.json"
    done = subprocess.run(
        [sys.executable, "scripts/envoy_compat.py", "--configs", "defaults,envoy-env", "--reference", found, "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    if done.returncode != 0 and "go mod download" in done.stderr:
        pytest.skip(f"the fixtures at {REFERENCE_VERSION} cannot be had: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report: dict[str, Any] = json.loads(out.read_text())
    report["printed"] = done.stdout
    return report


def test_the_fixtures_are_the_binarys_commit(pinned_run: dict[str, Any]) -> None:
    from ratewarden.bench.gateway_peers import REFERENCE_VERSION

    assert pinned_run["pinned"] == REFERENCE_VERSION
    assert pinned_run["reference_version"].endswith(f" {REFERENCE_VERSION}")
    assert Path(pinned_run["source"]).name == f"ratelimit@{REFERENCE_VERSION}"
    assert len(pinned_run["scenarios"]) >= 10 and "test/wildcard.yaml" in pinned_run["scenarios"]
    commit = REFERENCE_VERSION.rsplit("-", 1)[1]
    assert f"`{REFERENCE_VERSION}` (commit {commit})" in _compat_section()


def test_envoy_env_answers_as_the_reference_but_the_kept_error_codes(pinned_run: dict[str, Any]) -> None:
    """Every answer of ``--envoy-env`` with the reference's own environment is the reference's, except
    the error codes kept on purpose, each listed in the docs' compatibility table with "none: kept"."""
    env = pinned_run["configs"]["envoy-env"]
    assert (env["other"], env["kinds"], env["other_sequences"]) == (0, {}, {}), pinned_run["printed"]
    assert sorted(k["sequence"] for k in env["kept"]) == sorted(KEPT_ROWS)
    assert env["identical"] == env["answers"] - len(KEPT_ROWS)
    rows = {line.split(" | ")[0] + " |": line for line in _compat_section().splitlines() if line.startswith("| ")}
    for kept in env["kept"]:
        assert kept["ratewarden"] == "INVALID_ARGUMENT"
        assert "none: kept" in rows[KEPT_ROWS[kept["sequence"]]], kept


def test_the_counts_are_the_docs(pinned_run: dict[str, Any]) -> None:
    """The compatibility table's counts (``LIMIT_RESPONSE_HEADERS_ENABLED=true``) are this run's, for
    ratewarden's defaults and ``--envoy-env``; the defaults differ only where the table says why."""
    table = _compat_section()
    for name, row in (("defaults", "| defaults | `LIMIT_RESPONSE_HEADERS_ENABLED=true` |"),
                      ("envoy-env", "| `--envoy-env` | `LIMIT_RESPONSE_HEADERS_ENABLED=true` |")):
        line = next(line for line in table.splitlines() if line.startswith(row))
        config = pinned_run["configs"][name]
        assert f"| {config['identical']} of {config['answers']} |" in line, (line, pinned_run["printed"])
    defaults = pinned_run["configs"]["defaults"]
    assert set(defaults["kinds"]) <= {"headers", "limit_remaining", "status code", "overall_code",
                                      "not served (ratewarden refused the configuration)"}, defaults["kinds"]
    assert sorted(k["sequence"] for k in defaults["kept"]) == sorted(KEPT_ROWS)
