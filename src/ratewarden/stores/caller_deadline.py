"""The deadline of the caller whose decision is running, for the stores' queues.

A gateway call carries its own deadline (gRPC's ``grpc-timeout``); past it the front door has
answered DEADLINE_EXCEEDED already. A store call queued for it (behind a pipeline in flight to a
slow store) must then never be sent, or it charges a request nobody admitted. The door sets
``CALLER_DEADLINE`` (the event loop's clock) around each step of a decision; a store that queues
calls reads it when one is queued and drops the call at send time once it has passed. A timer
cancelling the decision is not enough: in the loop pass where the store wakes up, the queued send
may run before that timer.
"""

from __future__ import annotations

import math
from contextvars import ContextVar

__all__ = ["CALLER_DEADLINE"]

#: The loop time after which nobody waits for the decision being run (``math.inf``: no deadline).
CALLER_DEADLINE: ContextVar[float] = ContextVar("ratewarden_caller_deadline", default=math.inf)
