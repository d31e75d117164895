"""``RateLimitService``: envoyproxy/ratelimit's semantics over ratewarden's limiter (memory store)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from ratewarden.algorithms import ALGORITHMS
from ratewarden.decision import Decision
from ratewarden.errors import LimitUnavailable, StoreError
from ratewarden.headers import policy_value, rate_limit_headers, retry_after_header
from ratewarden.limiter import Limiter
from ratewarden.serve.envoy_config import parse_envoy_config
from ratewarden.serve.rls import UINT32_MAX, RateLimitService, RequestDescriptor, RlsAnswer, RlsRequestError
from ratewarden.stores import MemoryStore

from .readme_examples import EXAMPLE_2, EXAMPLE_3, EXAMPLE_5, EXAMPLE_6, EXAMPLE_7, EXAMPLE_11

#: The store's clock: mid-second, mid-hour, mid-day, so no window ends during a test and no bucket
#: refills (the README's per-second limits stay exact however long a test takes).
NOW = 1_000.5  # (at wall-clock magnitudes GCRA's float residue refuses the last unit: reported)


def frozen() -> float:
    return NOW


def service(*texts: str, limiter: Limiter | None = None) -> RateLimitService:
    domains = {d.domain: d for d in (parse_envoy_config(t) for t in texts)}
    return RateLimitService(domains, limiter or Limiter(MemoryStore(clock=frozen)))


def d(*entries: tuple[str, str], limit: tuple[int, str] | None = None, hits: int | None = None) -> RequestDescriptor:
    return RequestDescriptor(tuple(entries), limit, hits)


async def ok_count(rls: RateLimitService, domain: str, descriptors: Sequence[RequestDescriptor], n: int,
                   hits: int = 1) -> int:
    answers = await asyncio.gather(*(rls.should_rate_limit(domain, descriptors, hits) for _ in range(n)))
    return sum(a.overall_ok for a in answers)


async def test_exactly_the_limit_under_concurrency() -> None:
    rls = service(EXAMPLE_2)
    assert await ok_count(rls, "messaging", [d(("to_number", "1"))], 150) == 100
    assert await ok_count(rls, "messaging", [d(("to_number", "2"))], 3) == 3  # another value, another counter


async def test_statuses_and_headers() -> None:
    rls = service(EXAMPLE_2)
    answer = await rls.should_rate_limit(
        "messaging", [d(("message_type", "marketing"), ("to_number", "1")), d(("to_number", "1")), d(("nothing", "x"))]
    )
    assert answer.overall_ok
    first, second, third = answer.statuses
    assert (first.code, first.limit_remaining, second.limit_remaining) == ("OK", 4, 99)
    assert first.current_limit is not None and first.current_limit.requests_per_unit == 5
    assert first.current_limit.unit == "day" and 0 < first.duration_until_reset <= 86400
    assert (third.code, third.current_limit) == ("OK", None)
    headers = dict(answer.headers)
    assert headers["x-ratelimit-limit"] == "5" and headers["x-ratelimit-remaining"] == "4"
    assert headers["ratelimit"].endswith(";r=4;t=" + headers["x-ratelimit-reset"])
    assert '"messaging.message_type_marketing.to_number";q=5;w=86400' in headers["ratelimit-policy"]
    assert '"messaging.to_number";q=100;w=86400' in headers["ratelimit-policy"]
    assert "retry-after" not in headers


async def test_all_or_nothing_across_descriptors() -> None:
    rls = service(EXAMPLE_2)
    both = [d(("message_type", "marketing"), ("to_number", "7")), d(("to_number", "7"))]
    assert await ok_count(rls, "messaging", both, 8) == 5
    answer = await rls.should_rate_limit("messaging", both)
    assert [s.code for s in answer.statuses] == ["OVER_LIMIT", "OK"]
    assert answer.statuses[1].limit_remaining == 95  # the denied requests charged nothing
    assert "retry-after" in dict(answer.headers)
    assert await ok_count(rls, "messaging", [d(("to_number", "7"))], 200) == 95


async def test_hits_addend_is_the_cost_zero_counts_as_one() -> None:
    rls = service(EXAMPLE_2)
    first = await rls.should_rate_limit("messaging", [d(("to_number", "1"))], hits_addend=30)
    assert first.statuses[0].limit_remaining == 70
    zero = await rls.should_rate_limit("messaging", [d(("to_number", "1"))], hits_addend=0)
    assert zero.statuses[0].limit_remaining == 69
    per_descriptor = await rls.should_rate_limit("messaging", [d(("to_number", "1"), hits=0)], hits_addend=5)
    assert per_descriptor.overall_ok and per_descriptor.statuses[0].limit_remaining == 69  # 0: a check only
    over = await rls.should_rate_limit("messaging", [d(("to_number", "1"))], hits_addend=70)
    assert not over.overall_ok and over.statuses[0].limit_remaining == 69


async def test_override_replaces_the_rate_and_counts_apart() -> None:
    rls = service(EXAMPLE_2)
    three = d(("to_number", "5"), limit=(3, "minute"))
    assert await ok_count(rls, "messaging", [three], 10) == 3
    answer = await rls.should_rate_limit("messaging", [three])
    status = answer.statuses[0]
    assert status.current_limit is not None
    assert (status.current_limit.name, status.current_limit.requests_per_unit, status.current_limit.unit) == ("", 3, "minute")
    assert await ok_count(rls, "messaging", [d(("to_number", "5"), limit=(4, "minute"))], 10) == 4
    assert await ok_count(rls, "messaging", [d(("to_number", "5"))], 10) == 10  # the configured 100/day
    # an override applies even where nothing in the domain matches (as in the Go service)
    assert await ok_count(rls, "messaging", [d(("unknown", "x"), limit=(2, "hour"))], 5) == 2
    zero = await rls.should_rate_limit("messaging", [d(("unknown", "x"), limit=(0, "hour"))])
    assert not zero.overall_ok


async def test_shadow_mode_counts_but_never_limits() -> None:
    rls = service(EXAMPLE_6)
    a = [d(("service", "auth"), ("user", "user-a"))]
    answers = [await rls.should_rate_limit("example6", a) for _ in range(12)]
    assert all(x.overall_ok for x in answers)
    assert [x.statuses[0].shadowed for x in answers] == [False] * 10 + [True] * 2
    assert all(x.statuses[0].code == "OK" for x in answers)
    assert answers[-1].statuses[0].limit_remaining == 0
    assert answers[-1].headers == []  # a shadow limit is not shown to clients
    b = [d(("service", "auth"), ("user", "user-b"))]
    assert await ok_count(rls, "example6", b, 25) == 20
    # a shadow descriptor next to an enforced one: the enforced one decides alone
    both = [*a, d(("service", "auth"), ("user", "user-b"))]
    answer = await rls.should_rate_limit("example6", both)
    assert not answer.overall_ok and [s.code for s in answer.statuses] == ["OK", "OVER_LIMIT"]


async def test_unlimited_touches_no_store() -> None:
    class Refusing(MemoryStore):
        async def hit(self, *args: object) -> object:  # type: ignore[override]
            raise AssertionError("the store was asked")

        def hit_now(self, *args: object) -> object:  # type: ignore[override]
            raise AssertionError("the store was asked")

    rls = service(EXAMPLE_5, limiter=Limiter(Refusing(), fallback=None))
    answer = await rls.should_rate_limit("internal", [d(("ldap", "u"))])
    assert answer.overall_ok and answer.statuses[0].limit_remaining == UINT32_MAX
    assert answer.statuses[0].current_limit is None and answer.headers == []


async def test_requests_per_unit_zero_is_always_over() -> None:
    rls = service(EXAMPLE_3)
    blocked = await rls.should_rate_limit("edge_proxy_per_ip", [d(("remote_address", "50.0.0.5"))])
    assert not blocked.overall_ok and blocked.statuses[0].code == "OVER_LIMIT"
    # Refused by a limit of 0: its headers, as any refusal has, and no Retry-After (nothing ever fits).
    headers = dict(blocked.headers)
    assert headers["ratelimit-policy"] == '"edge_proxy_per_ip.remote_address_50.0.0.5";q=0;w=1'
    assert headers["ratelimit"].startswith('"edge_proxy_per_ip.remote_address_50.0.0.5";r=0;t=')
    assert (headers["x-ratelimit-limit"], headers["x-ratelimit-remaining"]) == ("0", "0")
    assert "retry-after" not in headers
    assert await ok_count(rls, "edge_proxy_per_ip", [d(("remote_address", "50.0.0.1"))], 15) == 10
    # Beside a counted descriptor, the limit of 0 decides, both are listed, and nothing is charged.
    both = await rls.should_rate_limit(
        "edge_proxy_per_ip", [d(("remote_address", "50.0.0.2")), d(("remote_address", "50.0.0.5"))])
    assert not both.overall_ok and [s.code for s in both.statuses] == ["OK", "OVER_LIMIT"]
    assert dict(both.headers)["ratelimit-policy"] == (
        '"edge_proxy_per_ip.remote_address";q=10;w=1, "edge_proxy_per_ip.remote_address_50.0.0.5";q=0;w=1')
    assert dict(both.headers)["x-ratelimit-limit"] == "0"
    assert await ok_count(rls, "edge_proxy_per_ip", [d(("remote_address", "50.0.0.2"))], 15) == 10


async def test_replaces() -> None:
    rls = service(EXAMPLE_7)
    user1 = d(("key_1", "value_1"), ("user", "bkthomps"))
    user2 = d(("key_2", "value_2"), ("user", "bkthomps"))
    assert await ok_count(rls, "example7", [user1, user2], 12) == 10  # specific_limit (5/s) replaced
    answer = await rls.should_rate_limit("example7", [user1, user2])
    assert answer.statuses[0].current_limit is None and answer.statuses[0].code == "OK"
    assert await ok_count(rls, "example7", [user1], 7) == 5  # and it was not charged


async def test_wildcard_counters_per_value_or_shared() -> None:
    rls = service(EXAMPLE_11)
    assert await ok_count(rls, "example11", [d(("files", "files/a.pdf"))], 6) == 6
    assert await ok_count(rls, "example11", [d(("files", "files/b.csv"))], 6) == 4  # one shared threshold
    assert await ok_count(rls, "example11", [d(("files_no_share", "files_no_share/a.pdf"))], 12) == 10
    assert await ok_count(rls, "example11", [d(("files_no_share", "files_no_share/b.pdf"))], 12) == 10


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
async def test_every_algorithm(algorithm: str) -> None:
    text = f"domain: algo\ndescriptors:\n  - key: client\n    algorithm: {algorithm}\n    rate_limit: {{unit: hour, requests_per_unit: 7}}\n"
    rls = service(text)
    assert await ok_count(rls, "algo", [d(("client", "c"))], 20) == 7
    limit = rls.domains["algo"].root.children["client"].rate_limit
    assert limit is not None and limit.limit is not None and limit.limit.algorithm == algorithm


async def test_storage_key_has_domain_entries_and_rate() -> None:
    store = MemoryStore(clock=frozen)
    rls = service(EXAMPLE_2, EXAMPLE_2.replace("domain: messaging", "domain: other"), limiter=Limiter(store, prefix="t"))
    await rls.should_rate_limit("messaging", [d(("to_number", "a&b=c"))])
    await rls.should_rate_limit("other", [d(("to_number", "a&b=c"))])
    await rls.should_rate_limit("messaging", [d(("to_number", "a&b=c"), limit=(9, "second"))])
    keys = sorted(store._data)
    assert keys == [
        "t:{envoy:messaging|to_number=a%26b%3Dc}:fixed_window:100/86400000",
        "t:{envoy:messaging|to_number=a%26b%3Dc}:fixed_window:9/1000",
        "t:{envoy:other|to_number=a%26b%3Dc}:fixed_window:100/86400000",
    ]


async def test_unknown_domain_is_ok_without_limits() -> None:
    answer = await service(EXAMPLE_2).should_rate_limit("nope", [d(("to_number", "1"))])
    assert answer.overall_ok and answer.statuses[0].current_limit is None


@pytest.mark.parametrize(
    ("domain", "descriptors", "says"),
    [
        ("", [d(("a", "b"))], "domain must not be empty"),
        ("messaging", [], "descriptor list must not be empty"),
        ("messaging", [d()], "descriptor 0 has no entries"),
        ("messaging", [d(("", "x"))], "empty key"),
        ("messaging", [d(("a", "b"), limit=(1, "fortnight"))], "limit override unit"),
        ("messaging", [d(("a", "b"), hits=-1)], "must not be negative"),
    ],
)
async def test_bad_requests(domain: str, descriptors: list[RequestDescriptor], says: str) -> None:
    with pytest.raises(RlsRequestError, match=says):
        await service(EXAMPLE_2).should_rate_limit(domain, descriptors)


class Broken(MemoryStore):
    @property
    def local(self) -> bool:  # type: ignore[override]
        return False

    async def hit(self, *args: object) -> object:  # type: ignore[override]
        raise StoreError("down", reason="unreachable")


async def test_store_failure_fail_closed_is_unavailable() -> None:
    rls = service(EXAMPLE_2, limiter=Limiter(Broken(), on_error="closed"))
    with pytest.raises(LimitUnavailable):
        await rls.should_rate_limit("messaging", [d(("to_number", "1"))])


async def test_store_failure_fail_open_is_decided_by_the_insurance_limiter() -> None:
    rls = service(EXAMPLE_2, limiter=Limiter(Broken(), on_error="open"))
    answers: list[RlsAnswer] = [await rls.should_rate_limit("messaging", [d(("to_number", "1"))]) for _ in range(105)]
    assert sum(a.overall_ok for a in answers) == 100  # limited locally, never unlimited


BOTH_MODES = """\
domain: both
descriptors:
  - key: watched
    shadow_mode: true
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"""


async def test_a_descriptor_both_shadow_and_quota_is_a_shadow_one() -> None:
    """Counted, over after its limit, never refusing; and a failed store under fail-closed is no
    ``UNAVAILABLE`` for it (a shadow limit never applies the failure policy), whatever the charge."""
    rls = service(BOTH_MODES)
    answers = [await rls.should_rate_limit("both", [d(("watched", "x"))]) for _ in range(2)]
    assert all(a.overall_ok for a in answers)
    assert [a.statuses[0].shadowed for a in answers] == [False, True]
    for charge in ("all", "each"):
        broken = RateLimitService({"both": parse_envoy_config(BOTH_MODES)}, Limiter(Broken(), on_error="closed"), charge=charge)
        answer = await broken.should_rate_limit("both", [d(("watched", "x"))])
        assert answer.overall_ok and answer.statuses[0].current_limit is None


async def test_replace_swaps_the_configuration() -> None:
    rls = service(EXAMPLE_2)
    rls.replace({"example6": parse_envoy_config(EXAMPLE_6)})
    assert (await rls.should_rate_limit("messaging", [d(("to_number", "1"))])).statuses[0].current_limit is None
    assert "example6" in rls.domains


async def test_headers_are_the_librarys_headers() -> None:
    """The answer's headers are ``headers.rate_limit_headers`` (both styles) and ``Retry-After``, as text."""
    rls = service(EXAMPLE_2)
    limit = rls.domains["messaging"].root.children["to_number"].rate_limit
    assert limit is not None and limit.limit is not None
    answer = await rls.should_rate_limit("messaging", [d(("to_number", "h"))], hits_addend=99)
    decision = Decision(True, 100, 1, 86400 - 1000.5, 0.0, 86400.0, limit.limit.name)
    expected = rate_limit_headers(decision, "both", policy_value([limit.limit]))
    assert answer.headers == [(k.decode(), v.decode()) for k, v in expected]
    over = await rls.should_rate_limit("messaging", [d(("to_number", "h"))], hits_addend=2)
    denied = Decision(False, 100, 1, 86400 - 1000.5, 86400 - 1000.5, 86400.0, limit.limit.name)
    retry = retry_after_header(denied)
    assert retry is not None
    expected = [*rate_limit_headers(denied, "both", policy_value([limit.limit])), retry]
    assert over.headers == [(k.decode(), v.decode()) for k, v in expected]
