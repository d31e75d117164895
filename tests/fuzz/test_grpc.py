"""Fuzzing Envoy's rate limit API on both running gRPC doors (compiled: ``ratewarden._front``; python:
grpc.aio) with grpcio's client: random ``RateLimitRequest`` messages (domains, descriptors, entries of
any unicode, limit overrides of any unit, ``hits_addend`` up to its largest) and random bytes as the
message.

Each answer is OK (its overall code OK or OVER_LIMIT, one status per descriptor) or INVALID_ARGUMENT or
RESOURCE_EXHAUSTED with a message: never UNKNOWN or INTERNAL; and a normal call is answered afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # type: ignore[import-untyped]
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]
from google.protobuf import wrappers_pb2  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from ratewarden.serve import bounds

from .conftest import fuzz
from .doors import SLACK, Door, Hang

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
REFUSED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
Entry = ratelimit_pb2.RateLimitDescriptor.Entry
Override = ratelimit_pb2.RateLimitDescriptor.RateLimitOverride

# -- the messages ---------------------------------------------------------------------------------------

_KEYS = ["user", "small", "open", "nested", "inner", "free", "missing"]
#: Any text protobuf can carry (UTF-8: no lone surrogates).
_unicode = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
_value = st.one_of(_unicode, _unicode, st.sampled_from(["u1", "*", "", "x" * 5000]))
_entry = st.builds(lambda k, v: Entry(key=k, value=v), st.one_of(st.sampled_from(_KEYS), st.sampled_from(_KEYS), _unicode),
                   _value)
_units = st.sampled_from([u for u in rls_pb2.RateLimitResponse.RateLimit.Unit.values() if u])
_unit = st.one_of(_units, _units, _units, st.just(0), st.integers(-(2**31), 2**31 - 1))
_override = st.builds(lambda n, unit: Override(requests_per_unit=n, unit=unit),
                      st.one_of(st.integers(0, 3), st.integers(0, 2**32 - 1)), _unit)
_uint64 = st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1), st.sampled_from([2**32 - 1, 2**63, 2**64 - 1]))


@st.composite
def descriptors(draw: st.DrawFn) -> Any:
    entries = draw(st.one_of(st.lists(_entry, min_size=1, max_size=4), st.lists(_entry, max_size=4)))
    descriptor = ratelimit_pb2.RateLimitDescriptor(entries=entries)
    if draw(st.integers(0, 3)) == 0:
        descriptor.limit.CopyFrom(draw(_override))
    if draw(st.integers(0, 2)) == 0:
        descriptor.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=draw(_uint64)))
    return descriptor


_small = st.builds(lambda k, v: ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key=k, value=v)]),
                   st.sampled_from(_KEYS), st.text(max_size=4))
_descriptor_lists = st.one_of(
    st.lists(descriptors(), max_size=4),
    st.lists(descriptors(), max_size=4),
    # around the bounds: as many descriptors, or entries, as a request may carry, and one more
    st.builds(lambda d, n: [d] * n, _small, st.sampled_from([bounds.MAX_DESCRIPTORS, bounds.MAX_DESCRIPTORS + 1])),
    st.builds(lambda k, n: [ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key=k, value="e")] * n)],
              st.sampled_from(_KEYS), st.sampled_from([bounds.MAX_ENTRIES, bounds.MAX_ENTRIES + 1])),
    # around the message size: one entry of about half of it, or more than all of it
    st.builds(lambda n: [ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key="user", value="v" * n)])],
              st.sampled_from([bounds.GRPC_MAX_MESSAGE_SIZE // 2, bounds.GRPC_MAX_MESSAGE_SIZE + 1])),
)
requests = st.builds(
    lambda domain, found, hits: rls_pb2.RateLimitRequest(domain=domain, descriptors=found, hits_addend=hits),
    st.one_of(st.just("fuzz"), st.just("fuzz"), _unicode), _descriptor_lists,
    st.one_of(st.just(0), st.integers(0, 2**32 - 1)),
)


# -- calls ------------------------------------------------------------------------------------------------


@pytest.fixture
def channel(door: Door) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(door.grpc_address) as opened:
        yield opened


def call(channel: grpc.Channel, message: bytes) -> tuple[grpc.StatusCode, str, Any]:
    """``(status code, details, response)`` of one call with ``message`` as it is (bytes)."""
    unary = channel.unary_unary(METHOD, request_serializer=bytes, response_deserializer=rls_pb2.RateLimitResponse.FromString)
    try:
        return grpc.StatusCode.OK, "", unary(message, timeout=SLACK)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            raise Hang(f"no answer within {SLACK:g} s: {exc.details()}") from None
        return exc.code(), exc.details() or "", None


def check_answer(code: grpc.StatusCode, details: str, answer: Any, descriptor_count: int | None) -> None:
    if code == grpc.StatusCode.OK:
        assert answer.overall_code in (OK, OVER), answer
        if descriptor_count is not None:
            assert len(answer.statuses) == descriptor_count, (len(answer.statuses), descriptor_count)
        return
    assert code in REFUSED, (code, details)
    assert details, f"{code} without a message"


def still_answers(channel: grpc.Channel, door: Door) -> None:
    normal = rls_pb2.RateLimitRequest(domain="fuzz", descriptors=[ratelimit_pb2.RateLimitDescriptor(
        entries=[Entry(key="open", value="probe")])])
    code, details, answer = call(channel, normal.SerializeToString())
    assert code == grpc.StatusCode.OK and answer.overall_code == OK, (code, details)
    door.alive()


def test_random_requests(door: Door, channel: grpc.Channel) -> None:
    @fuzz(200)
    @given(requests)
    def property(request: Any) -> None:
        with door.guard(request):
            code, details, answer = call(channel, request.SerializeToString())
            check_answer(code, details, answer, len(request.descriptors))
            still_answers(channel, door)

    property()


_encoded = requests.map(lambda r: r.SerializeToString()).filter(lambda b: len(b) < 4096)


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(_encoded))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        change = draw(st.sampled_from(["flip", "insert", "delete"]))
        if change == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif change == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at:at + draw(st.integers(1, 8))]
    return bytes(data)


def test_random_bytes_as_the_message(door: Door, channel: grpc.Channel) -> None:
    """Random bytes and mutated encodings of requests: decoded, they are answered as requests;
    undecodable, they are refused INVALID_ARGUMENT."""

    @fuzz(200)
    @given(st.one_of(st.binary(max_size=200), _mutated()))
    def property(message: bytes) -> None:
        with door.guard(message):
            code, details, answer = call(channel, message)
            check_answer(code, details, answer, None)
            still_answers(channel, door)

    property()


def test_bytes_that_are_no_request_are_invalid_argument(door: Door, channel: grpc.Channel) -> None:
    for message in (b"\xff", b"\x0a\x02\xff\xfe"):  # a cut varint; a domain that is not UTF-8
        code, details, _ = call(channel, message)
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details, (message, code, details)
    still_answers(channel, door)


def test_the_bounds_are_answered_invalid_argument_and_resource_exhausted(door: Door, channel: grpc.Channel) -> None:
    """The requests the properties draw around the bounds, once each, by name (so a change of the
    strategies cannot leave them out)."""
    one = ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key="user", value="b")])
    cases = {
        "too many descriptors": ([one] * (bounds.MAX_DESCRIPTORS + 1), grpc.StatusCode.INVALID_ARGUMENT),
        "too many entries": ([ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key="user", value="e")] * (bounds.MAX_ENTRIES + 1))],
                             grpc.StatusCode.INVALID_ARGUMENT),
        "over the message size": ([ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key="user", value="v" * bounds.GRPC_MAX_MESSAGE_SIZE)])],
                                  grpc.StatusCode.RESOURCE_EXHAUSTED),
        "a huge hits_addend": ([ratelimit_pb2.RateLimitDescriptor(entries=[Entry(key="user", value="h")],
                                                                 hits_addend=wrappers_pb2.UInt64Value(value=2**64 - 1))],
                               grpc.StatusCode.OK),
    }
    for name, (found, expected) in cases.items():
        message = rls_pb2.RateLimitRequest(domain="fuzz", descriptors=found, hits_addend=2**32 - 1).SerializeToString()
        code, details, answer = call(channel, message)
        assert code == expected, (name, code, details)
        check_answer(code, details, answer, len(found))
    still_answers(channel, door)


def test_the_probe_uses_the_published_stub(channel: grpc.Channel) -> None:
    """``call`` sends bytes as they are; the published stub agrees with it on a normal request."""
    request = rls_pb2.RateLimitRequest(domain="fuzz", descriptors=[ratelimit_pb2.RateLimitDescriptor(
        entries=[Entry(key="free", value="x")])])
    answer = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=SLACK)
    assert answer.overall_code == OK
