"""HAProxy's Stream Processing Offload Protocol (SPOP 2.0, HAProxy's ``doc/SPOE.txt``): the frames
``ratewarden serve --spoe`` reads and writes, as pure functions over bytes.

A frame is its length (4 bytes, big-endian, not counting itself), a type (1 byte), flags (4 bytes),
a stream id and a frame id (varints), then a payload: a list of key/value pairs (HELLO,
DISCONNECT), of messages (NOTIFY) or of actions (ACK). Values are typed (a type byte, then the
value); integers and lengths are HAProxy's variable-length integers (``encode_varint``).

Malformed input raises ``SpopError`` with the status code an agent answers it with.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..errors import ArgumentError, RatewardenError

__all__ = [
    "ACK",
    "AGENT_DISCONNECT",
    "AGENT_HELLO",
    "HAPROXY_DISCONNECT",
    "HAPROXY_HELLO",
    "NOTIFY",
    "SCOPE_TRANSACTION",
    "Frame",
    "Message",
    "SpopError",
    "Value",
    "ack",
    "agent_disconnect",
    "agent_hello",
    "decode_varint",
    "encode_varint",
    "header_list",
    "kv_list",
    "messages",
    "read_frame",
    "set_text",
    "set_var",
]

# Frame types.
HAPROXY_HELLO = 1
HAPROXY_DISCONNECT = 2
NOTIFY = 3
AGENT_HELLO = 101
AGENT_DISCONNECT = 102
ACK = 103

FLAG_FIN = 0x01
FLAG_ABORT = 0x02

# Typed data: the low 4 bits of the type byte (a boolean's value is bit 4).
_NULL, _BOOL, _INT32, _UINT32, _INT64, _UINT64, _IPV4, _IPV6, _STRING, _BINARY = range(10)
_TRUE = 0x10
_UINT64_MAX = 2**64 - 1

#: Variable scopes of a SET-VAR action.
SCOPE_PROCESS, SCOPE_SESSION, SCOPE_TRANSACTION, SCOPE_REQUEST, SCOPE_RESPONSE = range(5)
_SET_VAR = 1

Value = None | bool | int | str | bytes | ipaddress.IPv4Address | ipaddress.IPv6Address
_HEADER = struct.Struct(">BI")  # type, flags
_LENGTH = struct.Struct(">I")


class SpopError(RatewardenError):
    """A frame the agent cannot use; ``status`` is the DISCONNECT status code that says why
    (SPOE.txt: 3 too big, 4 invalid, 8 unsupported version, 10 fragmentation not supported...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def encode_varint(value: int) -> bytes:
    """``value`` (>= 0) as HAProxy's variable-length integer: one byte below 240, else a first byte
    with its top 4 bits set carrying the low 4 bits, then 7 bits a byte (the top bit: more follow)."""
    if value < 0:
        raise ArgumentError(f"a varint is not negative, got {value}")
    if value < 240:
        return bytes((value,))
    out = bytearray(((value | 0xF0) & 0xFF,))
    value = (value - 240) >> 4
    while value >= 128:
        out.append((value | 0x80) & 0xFF)
        value = (value - 128) >> 7
    out.append(value)
    return bytes(out)


def decode_varint(data: bytes, at: int) -> tuple[int, int]:
    """The varint at ``data[at:]`` and the offset after it."""
    try:
        value = data[at]
        at += 1
        if value < 240:
            return value, at
        shift = 4
        while True:
            byte = data[at]
            at += 1
            value += byte << shift
            shift += 7
            if byte < 128:
                if value > _UINT64_MAX:
                    raise SpopError(4, "a varint larger than 64 bits")
                return value, at
            if shift > 64:  # 9 bytes after the first carry 67 bits: a 10th more is no 64-bit value
                raise SpopError(4, "a varint longer than 10 bytes")
    except IndexError:
        raise SpopError(4, "a frame ends inside a varint") from None


def _string(data: bytes, at: int) -> tuple[bytes, int]:
    length = data[at] if at < len(data) else 240  # one byte below 240 (names, most values); else a varint
    if length < 240:
        at += 1
    else:
        length, at = decode_varint(data, at)
    end = at + length
    if end > len(data):
        raise SpopError(4, f"a string of {length} bytes runs past the end of its frame")
    return data[at:end], end


def _typed(data: bytes, at: int) -> tuple[Value, int]:
    if at >= len(data):
        raise SpopError(4, "a frame ends before a value")
    head = data[at]
    kind = head & 0x0F
    at += 1
    if kind == _STRING:
        text, at = _string(data, at)
        return text.decode("utf-8", "surrogateescape"), at
    if kind == _BINARY:
        return _string(data, at)
    if kind in (_UINT32, _UINT64):
        return decode_varint(data, at)
    if kind in (_INT32, _INT64):  # signed: HAProxy sends the varint of the two's complement bit pattern
        value, at = decode_varint(data, at)
        bits = 32 if kind == _INT32 else 64
        value &= (1 << bits) - 1
        return (value - (1 << bits) if value >> (bits - 1) else value), at
    if kind == _BOOL:
        return bool(head & _TRUE), at
    if kind == _NULL:
        return None, at
    if kind == _IPV4:
        if at + 4 > len(data):
            raise SpopError(4, "a frame ends inside an IPv4 address")
        return ipaddress.IPv4Address(data[at : at + 4]), at + 4
    if kind == _IPV6:
        if at + 16 > len(data):
            raise SpopError(4, "a frame ends inside an IPv6 address")
        return ipaddress.IPv6Address(data[at : at + 16]), at + 16
    raise SpopError(4, f"unknown data type {kind}")


def _encode_typed(value: Value) -> bytes:
    if isinstance(value, bool):
        return bytes((_BOOL | (_TRUE if value else 0),))
    if isinstance(value, int):
        if value < 0:
            raise ArgumentError(f"only unsigned integers are sent, got {value}")
        return bytes((_UINT32 if value < 2**32 else _UINT64,)) + encode_varint(value)
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogateescape")
        return bytes((_STRING,)) + encode_varint(len(raw)) + raw
    if isinstance(value, bytes):
        return bytes((_BINARY,)) + encode_varint(len(value)) + value
    if value is None:
        return bytes((_NULL,))
    if isinstance(value, ipaddress.IPv4Address):
        return bytes((_IPV4,)) + value.packed
    return bytes((_IPV6,)) + value.packed


def _encode_string(text: str) -> bytes:
    raw = text.encode()
    return encode_varint(len(raw)) + raw


@dataclass(frozen=True)
class Frame:
    """One frame: its type, flags, stream id, frame id and undecoded payload."""

    kind: int
    flags: int
    stream_id: int
    frame_id: int
    payload: bytes


def read_frame(data: bytes) -> Frame:
    """A frame's fields from its bytes (after the 4-byte length)."""
    if len(data) < 7:
        raise SpopError(4, f"a frame of {len(data)} bytes is shorter than its header")
    kind, flags = _HEADER.unpack_from(data)
    stream_id, at = decode_varint(data, 5)
    frame_id, at = decode_varint(data, at)
    if not flags & FLAG_FIN:
        raise SpopError(10, "fragmented frames are not supported")
    return Frame(kind, flags, stream_id, frame_id, data[at:])


def kv_list(payload: bytes) -> dict[str, Value]:
    """A HELLO or DISCONNECT payload: names and their values."""
    out: dict[str, Value] = {}
    at = 0
    while at < len(payload):
        name, at = _string(payload, at)
        out[name.decode("utf-8", "replace")], at = _typed(payload, at)
    return out


@dataclass(frozen=True)
class Message:
    """One message of a NOTIFY frame: its name and arguments (by name)."""

    name: str
    args: dict[str, Value]


def messages(payload: bytes) -> list[Message]:
    """A NOTIFY payload: its messages."""
    out: list[Message] = []
    at = 0
    while at < len(payload):
        name, at = _string(payload, at)
        if at >= len(payload):
            raise SpopError(4, "a message ends before its argument count")
        count = payload[at]
        at += 1
        args: dict[str, Value] = {}
        for _ in range(count):
            arg, at = _string(payload, at)
            args[arg.decode("utf-8", "replace")], at = _typed(payload, at)
        out.append(Message(name.decode("utf-8", "replace"), args))
    return out


def header_list(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The headers of HAProxy's ``req.hdrs_bin``: a name and a value (varint-prefixed) per header,
    up to an empty name and value. Names are lowercased (HTTP/2 and HAProxy's HTX keep them so)."""
    at = 0
    while at < len(data):
        name, at = _string(data, at)
        value, at = _string(data, at)
        if not name:
            return
        yield name.lower(), value


def _frame(kind: int, stream_id: int, frame_id: int, payload: bytes) -> bytes:
    body = _HEADER.pack(kind, FLAG_FIN) + encode_varint(stream_id) + encode_varint(frame_id) + payload
    return _LENGTH.pack(len(body)) + body


def agent_hello(max_frame_size: int, capabilities: Iterable[str] = ("pipelining",)) -> bytes:
    """The AGENT-HELLO frame: version 2.0, the frame size the agent accepts, its capabilities."""
    payload = (
        _encode_string("version") + _encode_typed("2.0")
        + _encode_string("max-frame-size") + _encode_typed(max_frame_size)
        + _encode_string("capabilities") + _encode_typed(",".join(capabilities))
    )
    return _frame(AGENT_HELLO, 0, 0, payload)


def agent_disconnect(status: int, message: str) -> bytes:
    """The AGENT-DISCONNECT frame: why the agent closes the connection (0: normal)."""
    payload = _encode_string("status-code") + _encode_typed(status) + _encode_string("message") + _encode_typed(message)
    return _frame(AGENT_DISCONNECT, 0, 0, payload)


_SET_VAR_HEADS: dict[tuple[str, int], bytes] = {}  # an action's bytes before its value, by (name, scope)


def _set_var_head(name: str, scope: int) -> bytes:
    head = _SET_VAR_HEADS.get((name, scope))
    if head is None:
        head = bytes((_SET_VAR, 3, scope)) + _encode_string(name)
        if len(_SET_VAR_HEADS) < 256:  # the agent's dozen names; any others are built each time
            _SET_VAR_HEADS[(name, scope)] = head
    return head


def set_var(name: str, value: Value, scope: int = SCOPE_TRANSACTION) -> bytes:
    """A SET-VAR action: HAProxy sets variable ``name`` (under the agent's ``var-prefix``)."""
    return _set_var_head(name, scope) + _encode_typed(value)


def set_text(name: str, text: bytes, scope: int = SCOPE_TRANSACTION) -> bytes:
    """``set_var`` of a string already encoded (UTF-8): header values and bodies as they are."""
    return _set_var_head(name, scope) + bytes((_STRING,)) + encode_varint(len(text)) + text


def ack(stream_id: int, frame_id: int, actions: Iterable[bytes] = ()) -> bytes:
    """The ACK frame answering NOTIFY ``(stream_id, frame_id)`` with ``actions`` (``set_var``)."""
    return _frame(ACK, stream_id, frame_id, b"".join(actions))
