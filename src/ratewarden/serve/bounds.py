"""The bounds ``ratewarden serve`` puts on what one caller can make a worker do or hold: connections,
time to send a request or frame, sizes and work per request (docs/serve.md#bounds). Each is a
command-line option; the defaults are far above what a gateway sends.
"""

from __future__ import annotations

__all__ = [
    "GRPC_HANDSHAKE_TIMEOUT",
    "GRPC_MAX_CONNECTIONS",
    "GRPC_MAX_MESSAGE_SIZE",
    "GRPC_MAX_PENDING",
    "GRPC_MAX_PENDING_BYTES",
    "GRPC_MAX_RECEIVING",
    "GRPC_MAX_RECEIVING_PER_CONNECTION",
    "GRPC_TIMEOUT",
    "HTTP_MAX_CONNECTIONS",
    "HTTP_MAX_HEADER_SIZE",
    "HTTP_TIMEOUT",
    "HTTP_TIMEOUT_KEEP_ALIVE",
    "MAX_DESCRIPTORS",
    "MAX_ENTRIES",
    "SPOE_MAX_BYTES",
    "SPOE_MAX_BYTES_IN_FLIGHT",
    "SPOE_MAX_CONNECTIONS",
    "SPOE_MESSAGE",
    "SPOE_TIMEOUT_FRAME",
    "SPOE_TIMEOUT_HELLO",
    "SPOE_TIMEOUT_IDLE",
    "SPOE_TIMEOUT_PROCESSING",
]

#: Open HTTP connections per worker; more are answered 503 and closed at once.
HTTP_MAX_CONNECTIONS = 1000
#: Seconds to send a whole HTTP request (its head and body) once it begins; then the connection is closed.
HTTP_TIMEOUT = 10.0
#: Seconds an HTTP connection may wait idle between requests (uvicorn's ``--timeout-keep-alive``).
HTTP_TIMEOUT_KEEP_ALIVE = 5
#: Bytes of an HTTP request's line and headers; more is answered 431.
HTTP_MAX_HEADER_SIZE = 64 * 1024

#: Open SPOE connections per worker (HAProxy keeps a few); more get AGENT-DISCONNECT status 13.
SPOE_MAX_CONNECTIONS = 256
#: Seconds for a new SPOE connection to send its HAPROXY-HELLO (HAProxy sends it at once).
SPOE_TIMEOUT_HELLO = 5.0
#: Seconds an SPOE connection may wait for its next frame (above spoe.conf's ``timeout idle 1m``,
#: so HAProxy closes an idle connection first).
SPOE_TIMEOUT_IDLE = 120.0
#: Seconds to send the rest of a frame once its length arrived.
SPOE_TIMEOUT_FRAME = 5.0
#: Bytes of NOTIFY frames one SPOE connection may have queued or being decided on the compiled front door;
#: past them no further frame is read from it until answers free some (HAProxy queues the rest).
SPOE_MAX_BYTES_IN_FLIGHT = 64 * 1024
#: The same over all of a worker's SPOE connections.
SPOE_MAX_BYTES = 32 * 1024 * 1024
#: Seconds a message may wait for its decision on the compiled front door; then it is dropped undecided
#: (HAProxy's ``timeout processing`` is shorter: it has moved on).
SPOE_TIMEOUT_PROCESSING = 1.0
#: The SPOE message decided (spoe.conf's ``spoe-message check``); a NOTIFY's other messages are ignored.
SPOE_MESSAGE = "check"

#: Bytes of one gRPC message (a ``RateLimitRequest``); more is answered RESOURCE_EXHAUSTED.
GRPC_MAX_MESSAGE_SIZE = 1024 * 1024
#: Open gRPC connections per worker on the compiled front door; one more is closed at once.
GRPC_MAX_CONNECTIONS = 1000
#: Seconds for a new gRPC connection on the compiled front door to send HTTP/2's preface and SETTINGS
#: (a gRPC client sends them at once); then it is closed, freeing its place under GRPC_MAX_CONNECTIONS.
GRPC_HANDSHAKE_TIMEOUT = 5.0
#: Seconds from a gRPC request's arrival to its answer on the compiled front door; then DEADLINE_EXCEEDED.
GRPC_TIMEOUT = 10.0
#: Requests waiting for a decision per worker on the compiled front door; more is RESOURCE_EXHAUSTED.
GRPC_MAX_PENDING = 10000
#: Bytes of the gRPC and HTTP requests waiting for a decision per worker on the compiled front door (a
#: decoded request's strings counted with their allocations); more is RESOURCE_EXHAUSTED (HTTP: 503).
GRPC_MAX_PENDING_BYTES = 32 * 1024 * 1024
#: Bytes of gRPC calls still being received (from their headers to their message's last byte, 8 KiB a
#: call plus what it sent) per connection on the compiled front door; more is RESOURCE_EXHAUSTED.
GRPC_MAX_RECEIVING_PER_CONNECTION = 4 * 1024 * 1024
#: The same over all of a worker's connections.
GRPC_MAX_RECEIVING = 32 * 1024 * 1024
#: Descriptors in one ``ShouldRateLimit`` request (Envoy sends a few); more is INVALID_ARGUMENT.
MAX_DESCRIPTORS = 256
#: Entries in one request, over all its descriptors; more is INVALID_ARGUMENT.
MAX_ENTRIES = 1024
