"""The SPOP 2.0 codec (``ratewarden.serve.spop``) against HAProxy's ``doc/SPOE.txt``: varints at
their edges, every typed value, the payload lists on hand-built bytes, frames, and malformed input
(always ``SpopError`` with the DISCONNECT status that says why, never an ``IndexError``)."""

from __future__ import annotations

import ipaddress
import random
import struct

import pytest

from ratewarden.serve.spop import (
    ACK,
    AGENT_DISCONNECT,
    AGENT_HELLO,
    SpopError,
    ack,
    agent_disconnect,
    agent_hello,
    decode_varint,
    encode_varint,
    header_list,
    kv_list,
    messages,
    read_frame,
    set_var,
)

# SPOE.txt's varint, written out by hand: below 240 one byte; else the first byte is 0xF0 | the low
# 4 bits, then 7 bits a byte, each byte but the last with its top bit set (HAProxy adds the whole
# byte when decoding, so the encoder subtracts what the top bit adds).
VECTORS = [
    (0, "00"),
    (1, "01"),
    (239, "ef"),
    (240, "f000"),
    (241, "f100"),
    (2287, "ff7f"),
    (2288, "f08000"),
    (264431, "ffff7f"),
    (264432, "f0808000"),
    (2**32 - 1, "fff0fefe7e"),
    (2**63, "f0f1fefefefefefefe06"),
    (2**64 - 1, "fff0fefefefefefefe0e"),
]


def spec_decode(data: bytes) -> int:
    """SPOE.txt's ``decode_varint``: the first byte, plus each next byte shifted by 4, 11, 18..."""
    value = data[0]
    if value < 240:
        assert len(data) == 1
        return value
    shift = 4
    for index, byte in enumerate(data[1:], 1):
        value += byte << shift
        shift += 7
        if byte < 128:
            assert index == len(data) - 1
            return value
    raise AssertionError("unterminated")


def string(raw: bytes | str) -> bytes:
    raw = raw.encode() if isinstance(raw, str) else raw
    assert len(raw) < 240
    return bytes((len(raw),)) + raw


# -- varints ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "encoded"), VECTORS)
def test_varint_vectors_both_ways(value: int, encoded: str) -> None:
    raw = bytes.fromhex(encoded)
    assert spec_decode(raw) == value  # the vector itself is right
    assert encode_varint(value) == raw
    assert decode_varint(raw, 0) == (value, len(raw))
    # at an offset, followed by more bytes
    assert decode_varint(b"\xaa\xbb" + raw + b"\x07", 2) == (value, 2 + len(raw))


def test_varint_round_trips() -> None:
    rng = random.Random(7)
    values = list(range(0, 5000)) + [rng.randrange(2**bits) for bits in range(1, 65) for _ in range(20)]
    values += [264431 + d for d in range(-3, 4)] + [2**64 - 1, 2**64 - 2]
    for value in values:
        raw = encode_varint(value)
        assert spec_decode(raw) == value
        assert decode_varint(raw, 0) == (value, len(raw))
    with pytest.raises(ValueError):
        encode_varint(-1)


def test_varint_truncated_or_too_long_is_invalid() -> None:
    for encoded in ("", "f0", "f080", "ff8080", "f0f1fefefefefefefe"):
        with pytest.raises(SpopError) as info:
            decode_varint(bytes.fromhex(encoded), 0)
        assert info.value.status == 4
    with pytest.raises(SpopError) as info:
        decode_varint(b"\x05", 1)  # the offset is past the end
    assert info.value.status == 4
    # 11 bytes (10 continuation bytes): longer than any 64-bit value needs
    with pytest.raises(SpopError) as info:
        decode_varint(bytes.fromhex("f0" + "80" * 9 + "01"), 0)
    assert info.value.status == 4
    with pytest.raises(SpopError) as info:
        decode_varint(bytes.fromhex("f0" + "80" * 30), 0)
    assert info.value.status == 4


# -- typed values ------------------------------------------------------------------------------------


def test_every_typed_value_kind() -> None:
    v6 = ipaddress.IPv6Address("2001:db8::7")
    payload = (
        string("null") + b"\x00"
        + string("yes") + b"\x11"
        + string("no") + b"\x01"
        + string("i32") + b"\x02" + bytes.fromhex("ff7f")
        + string("u32") + b"\x03" + bytes.fromhex("fff0fefe7e")
        + string("i64") + b"\x04" + bytes.fromhex("f08000")
        + string("u64") + b"\x05" + bytes.fromhex("fff0fefefefefefefe0e")
        + string("v4") + b"\x06" + bytes((192, 0, 2, 1))
        + string("v6") + b"\x07" + v6.packed
        + string("str") + b"\x08" + string("héllo")
        + string("bin") + b"\x09" + string(b"\x00\xff\x01")
        + string("empty") + b"\x08\x00"
    )
    assert kv_list(payload) == {
        "null": None, "yes": True, "no": False, "i32": 2287, "u32": 2**32 - 1, "i64": 2288, "u64": 2**64 - 1,
        "v4": ipaddress.IPv4Address("192.0.2.1"), "v6": v6, "str": "héllo", "bin": b"\x00\xff\x01", "empty": "",
    }
    found = kv_list(payload)
    assert found["yes"] is True and found["no"] is False and isinstance(found["str"], str)
    assert isinstance(found["bin"], bytes)


def test_signed_integers_are_twos_complement() -> None:
    """HAProxy sends a signed sample (``SINT``) as INT64 with the varint of its 64-bit pattern."""
    minus_one = (2**64 - 1).to_bytes(8, "big")
    assert encode_varint(int.from_bytes(minus_one, "big")) == bytes.fromhex("fff0fefefefefefefe0e")
    payload = (string("a") + b"\x04" + bytes.fromhex("fff0fefefefefefefe0e")
               + string("b") + b"\x02" + bytes.fromhex("fff0fefe7e")
               + string("c") + b"\x04" + b"\x05")
    assert kv_list(payload) == {"a": -1, "b": -1, "c": 5}


def test_unknown_type_and_truncated_values_are_invalid() -> None:
    for bad in (
        string("x") + b"\x0a",  # type 10 does not exist
        string("x") + b"\x0f",
        string("x"),  # no value
        string("x") + b"\x06\x01\x02\x03",  # an IPv4 address of 3 bytes
        string("x") + b"\x07" + bytes(15),
        string("x") + b"\x08\x05abc",  # a string of 5 bytes, 3 there
        string("x") + b"\x09\xf0",  # a length cut inside its varint
        string("x") + b"\x03",  # an integer without its varint
        b"\x05ab",  # a name running past the end
    ):
        with pytest.raises(SpopError) as info:
            kv_list(bad)
        assert info.value.status == 4, bad


# -- payloads --------------------------------------------------------------------------------------


def test_kv_list_of_a_haproxy_hello() -> None:
    payload = (string("supported-versions") + b"\x08" + string("2.0")
               + string("max-frame-size") + b"\x03" + bytes.fromhex("fcf006")  # 16380
               + string("capabilities") + b"\x08" + string("pipelining,async")
               + string("healthcheck") + b"\x11"
               + string("engine-id") + b"\x08" + string("6F8B9E7E-2D4A"))
    assert spec_decode(bytes.fromhex("fcf006")) == 16380
    assert kv_list(payload) == {
        "supported-versions": "2.0", "max-frame-size": 16380, "capabilities": "pipelining,async",
        "healthcheck": True, "engine-id": "6F8B9E7E-2D4A",
    }
    assert kv_list(b"") == {}


def test_messages_of_a_notify() -> None:
    payload = (
        string("check") + b"\x04"
        + string("method") + b"\x08" + string("POST")
        + string("uri") + b"\x08" + string("/api/items?page=2")
        + string("ip") + b"\x06" + bytes((10, 1, 2, 3))
        + string("headers") + b"\x09" + string(string("host") + string("example") + b"\x00\x00")
        + string("other") + b"\x00"  # no arguments
    )
    found = messages(payload)
    assert [m.name for m in found] == ["check", "other"]
    assert found[0].args == {
        "method": "POST", "uri": "/api/items?page=2", "ip": ipaddress.IPv4Address("10.1.2.3"),
        "headers": string("host") + string("example") + b"\x00\x00",
    }
    assert found[1].args == {}
    for bad in (string("check"), string("check") + b"\x01", string("check") + b"\x02" + string("a") + b"\x00"):
        with pytest.raises(SpopError) as info:
            messages(bad)
        assert info.value.status == 4


def test_header_list_of_req_hdrs_bin() -> None:
    long_value = b"v" * 300  # a length of 2 varint bytes
    data = (string("Host") + string("example.com")
            + string("X-API-Key") + string("pk-alice")
            + string("x-empty") + b"\x00"
            + string("Cookie") + bytes.fromhex("fc03") + long_value
            + b"\x00\x00"
            + string("after-the-end") + string("ignored"))
    assert spec_decode(bytes.fromhex("fc03")) == 300
    assert list(header_list(data)) == [
        (b"host", b"example.com"), (b"x-api-key", b"pk-alice"), (b"x-empty", b""), (b"cookie", long_value),
    ]
    assert list(header_list(b"")) == []
    for bad in (string("host") + b"\x05abc", string("host"), b"\x09abc", string("host") + b"\xf0"):
        with pytest.raises(SpopError) as info:
            list(header_list(bad))
        assert info.value.status == 4


# -- frames ----------------------------------------------------------------------------------------


def test_read_frame() -> None:
    data = b"\x03" + struct.pack(">I", 1) + bytes.fromhex("f08000") + b"\x07" + b"payload"
    frame = read_frame(data)
    assert (frame.kind, frame.flags, frame.stream_id, frame.frame_id, frame.payload) == (3, 1, 2288, 7, b"payload")
    frame = read_frame(b"\x02" + struct.pack(">I", 1) + b"\x00\x00")
    assert (frame.kind, frame.stream_id, frame.frame_id, frame.payload) == (2, 0, 0, b"")
    abort = read_frame(b"\x03" + struct.pack(">I", 3) + b"\x01\x01")
    assert abort.flags == 3


def test_read_frame_without_fin_is_fragmentation() -> None:
    with pytest.raises(SpopError) as info:
        read_frame(b"\x03" + struct.pack(">I", 0) + b"\x01\x02payload")
    assert info.value.status == 10
    with pytest.raises(SpopError) as info:
        read_frame(b"\x03" + struct.pack(">I", 0x02) + b"\x01\x02payload")  # ABORT without FIN
    assert info.value.status == 10


def test_read_frame_truncated_is_invalid() -> None:
    for bad in (b"", b"\x03", b"\x03\x00\x00\x00\x01\x00", b"\x03\x00\x00\x00\x01\xf0\x80",
                b"\x03\x00\x00\x00\x01\x00\xf0"):
        with pytest.raises(SpopError) as info:
            read_frame(bad)
        assert info.value.status == 4, bad


def test_garbage_raises_only_spop_errors() -> None:
    """Random bytes and every truncation of valid payloads: a SpopError (status 4) or a result."""
    rng = random.Random(2024)
    hello = (string("supported-versions") + b"\x08" + string("2.0")
             + string("max-frame-size") + b"\x03" + bytes.fromhex("fcf006")
             + string("v6") + b"\x07" + bytes(16) + string("b") + b"\x09" + string(b"xyz"))
    notify = string("check") + b"\x02" + string("method") + b"\x08" + string("GET") + string("ip") + b"\x06" + bytes(4)
    headers = string("host") + string("a") + string("x") + string("yz") + b"\x00\x00"
    samples = [hello[:cut] for cut in range(len(hello))] + [notify[:cut] for cut in range(len(notify))]
    samples += [headers[:cut] for cut in range(len(headers))]
    samples += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40))) for _ in range(3000)]
    for data in samples:
        for parse in (kv_list, messages, lambda d: list(header_list(d)), read_frame):
            try:
                parse(data)
            except SpopError as exc:
                assert exc.status in (4, 10), (parse, data)


# -- frames the agent sends ------------------------------------------------------------------------


def _sent(frame: bytes) -> tuple[int, int, int, int, bytes]:
    """A frame the agent writes, read back by hand: (type, flags, stream id, frame id, payload)."""
    (length,) = struct.unpack_from(">I", frame)
    assert length == len(frame) - 4
    kind, flags = struct.unpack_from(">BI", frame, 4)
    assert frame[9] < 240 and frame[10] < 240  # the small ids used here
    return kind, flags, frame[9], frame[10], frame[11:]


def test_agent_hello_and_disconnect_frames() -> None:
    kind, flags, stream, frame_id, payload = _sent(agent_hello(16380))
    assert (kind, flags, stream, frame_id) == (AGENT_HELLO, 1, 0, 0)
    assert payload == (string("version") + b"\x08" + string("2.0")
                       + string("max-frame-size") + b"\x03" + bytes.fromhex("fcf006")
                       + string("capabilities") + b"\x08" + string("pipelining"))
    kind, flags, stream, frame_id, payload = _sent(agent_disconnect(3, "too big"))
    assert (kind, flags, stream, frame_id) == (AGENT_DISCONNECT, 1, 0, 0)
    assert payload == string("status-code") + b"\x03\x03" + string("message") + b"\x08" + string("too big")


def test_ack_with_set_var_actions() -> None:
    actions = [set_var("status", 429), set_var("retry_after", "60"), set_var("big", 2**40), set_var("flag", True),
               set_var("raw", b"\x00\x01"), set_var("none", None), set_var("ip", ipaddress.IPv4Address("10.0.0.1"))]
    assert actions[0] == b"\x01\x03\x02" + string("status") + b"\x03" + bytes.fromhex("fd0b")
    assert spec_decode(bytes.fromhex("fd0b")) == 429
    assert actions[1] == b"\x01\x03\x02" + string("retry_after") + b"\x08" + string("60")
    assert actions[2][: 3 + 4] == b"\x01\x03\x02" + string("big") and actions[2][7] == 0x05  # uint64
    assert actions[3] == b"\x01\x03\x02" + string("flag") + b"\x11"
    assert actions[4] == b"\x01\x03\x02" + string("raw") + b"\x09\x02\x00\x01"
    assert actions[5] == b"\x01\x03\x02" + string("none") + b"\x00"
    assert actions[6] == b"\x01\x03\x02" + string("ip") + b"\x06\x0a\x00\x00\x01"
    assert set_var("s", 1, scope=0)[:3] == b"\x01\x03\x00"
    frame = ack(5, 9, actions[:2])
    kind, flags, stream, frame_id, payload = _sent(frame)
    assert (kind, flags, stream, frame_id) == (ACK, 1, 5, 9)
    assert payload == actions[0] + actions[1]
    big_ids = ack(2288, 264432)
    assert big_ids[9:] == bytes.fromhex("f08000") + bytes.fromhex("f0808000")
