"""Envoy's rate limit service over real gRPC: the generated Envoy API's client (xds-protos'
``rls_pb2_grpc.RateLimitServiceStub`` on a ``grpc.aio`` channel) against ``start_grpc`` on a free
loopback port, with a configuration copied from envoyproxy/ratelimit's README; memory and Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # type: ignore[import-untyped]
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]
from google.protobuf import wrappers_pb2  # type: ignore[import-untyped]

from ratewarden.algorithms import ALGORITHMS
from ratewarden.enforcement.core import failure_counts
from ratewarden.limiter import FailurePolicy, Limiter
from ratewarden.serve.envoy_config import parse_envoy_config
from ratewarden.serve.grpc import rls_json, start_grpc
from ratewarden.serve.rls import RateLimitService
from ratewarden.stores import MemoryStore, RedisStore, Store

from .readme_examples import EXAMPLE_2, EXAMPLE_3, EXAMPLE_5, EXAMPLE_6, EXAMPLE_7, EXAMPLE_9_TRAILING

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
Unit = rls_pb2.RateLimitResponse.RateLimit.Unit
ALGORITHM_CONFIG = "domain: algorithms\ndescriptors:\n" + "".join(
    f"  - key: {name}\n    algorithm: {name}\n    rate_limit: {{unit: hour, requests_per_unit: 7}}\n" for name in ALGORITHMS
)
CONFIGS = (EXAMPLE_2, EXAMPLE_3, EXAMPLE_5, EXAMPLE_6, EXAMPLE_7, EXAMPLE_9_TRAILING, ALGORITHM_CONFIG)


class Rls:
    """A started service and a real client of it."""

    def __init__(self, service: RateLimitService, stub: Any) -> None:
        self.service = service
        self.stub = stub

    async def call(self, domain: str, *descriptors: Any, hits: int = 0) -> Any:
        request = rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descriptors), hits_addend=hits)
        return await self.stub.ShouldRateLimit(request, timeout=10)

    async def ok_count(self, n: int, domain: str, *descriptors: Any) -> int:
        answers = await asyncio.gather(*(self.call(domain, *descriptors) for _ in range(n)))
        return sum(a.overall_code == OK for a in answers)


def desc(*entries: tuple[str, str], limit: tuple[int, int] | None = None, hits: int | None = None) -> Any:
    descriptor = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if limit is not None:
        descriptor.limit.requests_per_unit, descriptor.limit.unit = limit
    if hits is not None:
        descriptor.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    return descriptor


#: Every store reads this clock: mid-second, mid-hour, mid-day, so no window ends during a test and no
#: bucket refills (the README's per-second limits stay exact however long a test takes).
NOW = 1_000.5  # (at wall-clock magnitudes GCRA's float residue refuses the last unit: reported)


def frozen() -> float:
    return NOW


def memory_store() -> Store:
    return MemoryStore(clock=frozen)


@pytest.fixture(params=["memory", "redis"])
def make_store(request: pytest.FixtureRequest) -> Callable[[], Store]:
    if request.param == "memory":
        return memory_store
    url = request.getfixturevalue("redis_standalone").url
    return lambda: RedisStore(url, clock=frozen, timeout=5.0)  # about decisions: a loaded machine must not turn an answer into a failure


@pytest.fixture
async def rls(make_store: Callable[[], Store]) -> AsyncIterator[Rls]:
    domains = {d.domain: d for d in (parse_envoy_config(text) for text in CONFIGS)}
    limiter = Limiter(make_store(), prefix=f"t{uuid.uuid4().hex[:12]}")  # fresh counters on a shared Redis
    service = RateLimitService(domains, limiter)
    server, port = await start_grpc(service, "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Rls(service, rls_pb2_grpc.RateLimitServiceStub(channel))
    finally:
        await channel.close()
        await server.stop(None)
        await limiter.close()


async def test_exactly_100_of_150_concurrent(rls: Rls) -> None:
    assert await rls.ok_count(150, "messaging", desc(("to_number", "2061111111"))) == 100
    answer = await rls.call("messaging", desc(("to_number", "2061111111")))
    assert answer.overall_code == OVER
    status = answer.statuses[0]
    assert status.code == OVER and status.limit_remaining == 0
    assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (100, Unit.Value("DAY"))
    assert 0 < status.duration_until_reset.seconds <= 86400
    headers = {h.key: h.value for h in answer.response_headers_to_add}
    assert headers["x-ratelimit-limit"] == "100" and headers["x-ratelimit-remaining"] == "0"
    assert headers["ratelimit-policy"] == '"messaging.to_number";q=100;w=86400'
    assert int(headers["retry-after"]) >= 1


async def test_readme_request_with_two_descriptors(rls: Rls) -> None:
    """Example 2's request: both descriptors, the aggregate answer, all or nothing."""
    marketing = desc(("message_type", "marketing"), ("to_number", "2061111111"))
    number = desc(("to_number", "2061111111"))
    assert await rls.ok_count(20, "messaging", marketing, number) == 5
    answer = await rls.call("messaging", marketing, number)
    assert [s.code for s in answer.statuses] == [OVER, OK]
    assert answer.statuses[1].limit_remaining == 95


async def test_hits_addend(rls: Rls) -> None:
    answer = await rls.call("messaging", desc(("to_number", "1")), hits=40)
    assert answer.statuses[0].limit_remaining == 60
    answer = await rls.call("messaging", desc(("to_number", "1"), hits=0))  # per descriptor, 0 only checks
    assert answer.overall_code == OK and answer.statuses[0].limit_remaining == 60
    assert (await rls.call("messaging", desc(("to_number", "1")), hits=61)).overall_code == OVER


async def test_override(rls: Rls) -> None:
    five = desc(("to_number", "9"), limit=(5, Unit.Value("MINUTE")))
    assert await rls.ok_count(12, "messaging", five) == 5
    status = (await rls.call("messaging", five)).statuses[0]
    assert (status.current_limit.requests_per_unit, status.current_limit.unit) == (5, Unit.Value("MINUTE"))
    assert await rls.ok_count(12, "messaging", desc(("to_number", "9"), limit=(8, Unit.Value("MINUTE")))) == 8


async def test_shadow_and_unlimited(rls: Rls) -> None:
    user_a = desc(("service", "auth"), ("user", "user-a"))
    assert await rls.ok_count(30, "example6", user_a) == 30  # shadow_mode: never limited
    assert await rls.ok_count(30, "example6", desc(("service", "auth"), ("user", "user-b"))) == 20
    answer = await rls.call("internal", desc(("ldap", "x")))
    assert answer.overall_code == OK and answer.statuses[0].limit_remaining == 2**32 - 1
    assert await rls.ok_count(120, "internal", desc(("azure", "x"))) == 100


async def test_replaces_and_wildcard(rls: Rls) -> None:
    first = desc(("key_1", "value_1"), ("user", "bkthomps"))
    second = desc(("key_2", "value_2"), ("user", "bkthomps"))
    assert await rls.ok_count(15, "example7", first, second) == 10
    assert await rls.ok_count(30, "example9", desc(("key1", "value1"))) == 20
    assert await rls.ok_count(30, "example9", desc(("key1", "valueXYZ"))) == 20  # its own counter
    assert (await rls.call("example9", desc(("key1", "other")))).statuses[0].HasField("current_limit") is False


async def test_blacklisted_ip(rls: Rls) -> None:
    assert (await rls.call("edge_proxy_per_ip", desc(("remote_address", "50.0.0.5")))).overall_code == OVER


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_every_algorithm(rls: Rls, algorithm: str) -> None:
    assert await rls.ok_count(20, "algorithms", desc((algorithm, "client"))) == 7


@pytest.mark.parametrize(
    ("domain", "descriptors", "says"),
    [
        ("", [desc(("a", "b"))], "domain must not be empty"),
        ("messaging", [], "descriptor list must not be empty"),
        ("messaging", [desc()], "has no entries"),
        ("messaging", [desc(("", "b"))], "empty key"),
        ("messaging", [desc(("a", "b"), limit=(1, 0))], "limit override unit"),
    ],
)
async def test_bad_requests_are_invalid_argument(rls: Rls, domain: str, descriptors: Sequence[Any], says: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await rls.call(domain, *descriptors)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in raised.value.details()
    assert (await rls.call("messaging", desc(("to_number", "1")))).overall_code == OK  # still serving


async def test_json_form(rls: Rls) -> None:
    body = json.dumps({"domain": "messaging", "descriptors": [{"entries": [{"key": "to_number", "value": "j"}]}],
                       "hitsAddend": 100}).encode()
    status, payload = await rls_json(rls.service, body)
    assert status == 200
    answer = json.loads(payload)
    assert answer["overallCode"] == "OK" and answer["statuses"][0]["currentLimit"]["unit"] == "DAY"
    status, payload = await rls_json(rls.service, body)
    assert status == 429 and json.loads(payload)["overallCode"] == "OVER_LIMIT"
    assert (await rls_json(rls.service, b"{not json"))[0] == 400
    status, payload = await rls_json(rls.service, b'{"domain": "", "descriptors": []}')
    assert status == 400 and "domain must not be empty" in json.loads(payload)["error"]


async def test_port_in_use_is_an_error() -> None:
    service = RateLimitService({}, Limiter(MemoryStore()))
    server, port = await start_grpc(service, "127.0.0.1", 0)
    try:
        with pytest.raises(OSError, match="cannot listen for gRPC"):
            await start_grpc(service, "127.0.0.1", port)
    finally:
        await server.stop(None)


DOC = Path(__file__).resolve().parents[2] / "docs" / "gateways" / "envoy.md"


def doc_yaml(marker: str) -> str:
    """The YAML block of docs/gateways/envoy.md that holds ``marker``."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    found = [block for block in blocks if marker in block]
    assert len(found) == 1, f"{marker!r} in {len(found)} blocks"
    return str(found[0])


def test_docs_envoy_yaml_is_a_valid_envoy_v3_bootstrap() -> None:
    """Envoy is not installed here: its configuration is checked against Envoy's v3 API instead
    (every field and typed_config parses with the generated Envoy API)."""
    import yaml
    from envoy.config.bootstrap.v3 import bootstrap_pb2  # type: ignore[import-untyped]
    from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2  # type: ignore[import-untyped]
    from envoy.extensions.filters.http.router.v3 import router_pb2  # type: ignore[import-untyped]  # noqa: F401
    from envoy.extensions.filters.network.http_connection_manager.v3 import (  # type: ignore[import-untyped]
        http_connection_manager_pb2,
    )
    from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # type: ignore[import-untyped]  # noqa: F401
    from google.protobuf import json_format

    bootstrap = json_format.ParseDict(yaml.safe_load(doc_yaml("static_resources")), bootstrap_pb2.Bootstrap())
    clusters = {c.name: c for c in bootstrap.static_resources.clusters}
    address = clusters["ratelimit"].load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address
    assert (address.address, address.port_value) == ("127.0.0.1", 8081)
    manager = http_connection_manager_pb2.HttpConnectionManager()
    bootstrap.static_resources.listeners[0].filter_chains[0].filters[0].typed_config.Unpack(manager)
    ratelimit = rate_limit_pb2.RateLimit()
    manager.http_filters[0].typed_config.Unpack(ratelimit)
    assert ratelimit.domain == "edge" and ratelimit.failure_mode_deny
    assert ratelimit.rate_limit_service.grpc_service.envoy_grpc.cluster_name == "ratelimit"


async def test_docs_config_yaml_answers_what_envoy_yaml_asks() -> None:
    """The docs' config.yaml, served over gRPC, with the descriptors the docs' envoy.yaml sends
    (remote_address always, api_key from x-api-key)."""
    config = parse_envoy_config(doc_yaml("descriptors:\n"), "config.yaml")
    assert "remote_address" in doc_yaml("static_resources") and "descriptor_key: api_key" in doc_yaml("static_resources")
    service = RateLimitService({config.domain: config}, Limiter(MemoryStore(clock=frozen)))
    server, port = await start_grpc(service, "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        client = Rls(service, rls_pb2_grpc.RateLimitServiceStub(channel))

        def request(ip: str, key: str | None = None) -> list[Any]:
            found = [desc(("remote_address", ip))]
            return found if key is None else [*found, desc(("api_key", key))]

        assert await client.ok_count(30, "edge", *request("10.0.0.1")) == 10
        assert await client.ok_count(150, "edge", desc(("api_key", "k1"))) == 100
        # two bursts of 550 (one channel: grpc's HTTP/2 transport resets bursts of well over 1000 streams)
        premium = desc(("api_key", "premium-7"))
        assert [await client.ok_count(550, "edge", premium) for _ in range(2)] == [550, 450]
        assert await client.ok_count(50, "edge", desc(("api_key", "internal-ci"))) == 50
        assert await client.ok_count(3, "edge", *request("10.0.0.2", "revoked-4711")) == 0
        assert await client.ok_count(3, "edge", *request("10.0.0.2", "k2")) == 3
    finally:
        await channel.close()
        await server.stop(None)


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("on_error", ["closed", "open"])
async def test_store_down(on_error: FailurePolicy) -> None:
    """Redis unreachable: fail-closed answers UNAVAILABLE (Envoy's failure_mode_deny then refuses);
    fail-open limits on the service's own memory, exactly, never unlimited."""
    store = RedisStore(f"redis://127.0.0.1:{closed_port()}/0", timeout=0.5, connect_timeout=0.5)
    limiter = Limiter(store, on_error=on_error)
    config = parse_envoy_config(EXAMPLE_2)
    service = RateLimitService({config.domain: config}, limiter)
    server, port = await start_grpc(service, "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        client = Rls(service, rls_pb2_grpc.RateLimitServiceStub(channel))
        if on_error == "closed":
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await client.call("messaging", desc(("to_number", "1")))
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "store failed" in raised.value.details()
        else:
            assert await client.ok_count(150, "messaging", desc(("to_number", "1"))) == 100
    finally:
        await channel.close()
        await server.stop(None)
        await limiter.close()


@contextlib.asynccontextmanager
async def down_store_rls(text: str, **options: Any) -> AsyncIterator[Rls]:
    """A started service whose Redis is unreachable, and a real client of it."""
    store = RedisStore(f"redis://127.0.0.1:{closed_port()}/0", timeout=0.5, connect_timeout=0.5)
    limiter = Limiter(store, **options)
    config = parse_envoy_config(text)
    service = RateLimitService({config.domain: config}, limiter)
    server, port = await start_grpc(service, "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Rls(service, rls_pb2_grpc.RateLimitServiceStub(channel))
    finally:
        await channel.close()
        await server.stop(None)
        await limiter.close()


async def test_store_down_a_shadow_descriptor_never_refuses() -> None:
    """Fail-closed: a shadow_mode descriptor whose store fails is OK (logged and counted as a failed
    shadow rule, as every door's shadow rules); an enforced descriptor beside it is UNAVAILABLE."""
    before = failure_counts().get(("shadow rule", "StoreError"), 0)
    async with down_store_rls(EXAMPLE_6, on_error="closed") as client:
        answer = await client.call("example6", desc(("service", "s"), ("user", "user-a")))
        assert answer.overall_code == OK and [s.code for s in answer.statuses] == [OK]
        assert not answer.response_headers_to_add
        assert failure_counts().get(("shadow rule", "StoreError"), 0) == before + 1
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await client.call("example6", desc(("service", "s"), ("user", "user-a")), desc(("service", "s"), ("user", "user-b")))
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_store_down_without_an_insurance_limiter_decides_nothing() -> None:
    """Fail-open without an insurance limiter: let through as every door lets such a request through,
    with nothing made up: no limit stated, no remaining count, no headers; counted as a failed check."""
    before = failure_counts().get(("store", "StoreError"), 0)
    async with down_store_rls(EXAMPLE_2, on_error="open", fallback=None) as client:
        answer = await client.call("messaging", desc(("to_number", "1")))
        assert answer.overall_code == OK and [s.code for s in answer.statuses] == [OK]
        assert not answer.statuses[0].HasField("current_limit") and answer.statuses[0].limit_remaining == 0
        assert not answer.response_headers_to_add
        assert failure_counts().get(("store", "StoreError"), 0) == before + 1


async def test_an_unexpected_error_is_internal_and_the_server_keeps_serving() -> None:
    class Failing(RateLimitService):
        calls = 0

        async def should_rate_limit(self, *args: Any, **kwargs: Any) -> Any:
            Failing.calls += 1
            if Failing.calls == 1:
                raise RuntimeError("boom")
            return await super().should_rate_limit(*args, **kwargs)

    config = parse_envoy_config(EXAMPLE_2)
    service = Failing({config.domain: config}, Limiter(MemoryStore(clock=frozen)))
    server, port = await start_grpc(service, "127.0.0.1", 0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        client = Rls(service, rls_pb2_grpc.RateLimitServiceStub(channel))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await client.call("messaging", desc(("to_number", "1")))
        assert raised.value.code() == grpc.StatusCode.INTERNAL and "RuntimeError: boom" in raised.value.details()
        assert (await client.call("messaging", desc(("to_number", "1")))).overall_code == OK
    finally:
        await channel.close()
        await server.stop(None)
