"""The requests one device session has sent and awaits, and the calls waiting to be sent.

``Pending`` is ``DeviceProtocol``'s bookkeeping, with no state machine of its own: it hands out
request ids, remembers what each request sent was for (to route its reply), and bounds the
session's ``tools/call`` requests: at most ``max_in_flight`` sent and unanswered at once, more
waiting here in order up to ``max_queued``. What to send and when is ``DeviceProtocol``'s business.
"""

from __future__ import annotations

import enum

from gateway.protocol.events import CallFailed, CallSucceeded
from gateway.protocol.jsonrpc import ErrorResponse, IdAllocator, Response

__all__ = ["FIRST_REQUEST_ID", "Pending", "Purpose", "call_result"]

# A session's request ids run FIRST_REQUEST_ID, FIRST_REQUEST_ID + 1, ... up to MAX_REQUEST_ID,
# then wrap to 1 (jsonrpc.IdAllocator), skipping the ids still awaiting a reply.
FIRST_REQUEST_ID = 1


class Purpose(enum.Enum):
    """What a request we sent was for, to route its reply."""

    INITIALIZE = "initialize"
    LIST = "tools/list"
    CALL = "tools/call"


class Pending:
    """The requests of one session awaiting replies, and the calls awaiting a free slot."""

    def __init__(self, max_in_flight: int, max_queued: int, ids: range | None = None) -> None:
        """Bound the calls: ``max_in_flight`` sent and unanswered (≥ 1), ``max_queued`` waiting.

        ``ids`` are the request ids to use (``FIRST_REQUEST_ID`` up, by default); a session
        that shares its device with another MCP client keeps to a range of its own.
        """
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self._ids = IdAllocator(ids=ids) if ids else IdAllocator(FIRST_REQUEST_ID)
        self._sent: dict[int, Purpose] = {}
        self._calls_sent = 0  # how many of _sent are calls: read at every call
        self._waiting: dict[int, str] = {}  # call id -> its frame, oldest first

    @property
    def calls(self) -> frozenset[int]:
        """Ids of the ``tools/call`` requests sent and still waiting for a reply."""
        return frozenset(i for i, purpose in self._sent.items() if purpose is Purpose.CALL)

    @property
    def waiting(self) -> tuple[int, ...]:
        """Ids of the calls not sent yet, waiting for a free slot, oldest first."""
        return tuple(self._waiting)

    def calls_in_flight(self) -> int:
        """How many ``tools/call`` requests are sent and unanswered."""
        return self._calls_sent

    def busy(self) -> str | None:
        """Why no call may be taken now (every slot taken, and the waiting line too), or None."""
        running = self.calls_in_flight()
        if running < self.max_in_flight or len(self._waiting) < self.max_queued:
            return None
        calls = "1 call" if running == 1 else f"{running} calls"
        return f"{calls} running and {len(self._waiting)} waiting"

    def new_id(self) -> int:
        """An id for the next request: one that no request sent or waiting holds."""
        return self._ids.allocate(self._sent.keys() | self._waiting.keys())

    def request(self, purpose: Purpose) -> int:
        """The id of a new request for ``purpose``, noted as sent (send it now)."""
        request_id = self.new_id()
        self._sent[request_id] = purpose
        self._calls_sent += purpose is Purpose.CALL
        return request_id

    def add_call(self, call_id: int, frame: str) -> bool:
        """Take a call: True when a slot is free and ``frame`` must go now, else it waits."""
        if self._calls_sent < self.max_in_flight:
            self._sent[call_id] = Purpose.CALL
            self._calls_sent += 1
            return True
        self._waiting[call_id] = frame
        return False

    def answered(self, request_id: object) -> Purpose | None:
        """The purpose of the request a reply with ``request_id`` settles, now settled; or None."""
        if not isinstance(request_id, int) or request_id not in self._sent:
            return None
        purpose = self._sent.pop(request_id)
        if purpose is Purpose.CALL:
            self._calls_sent -= 1
        return purpose

    def forget(self, call_id: int) -> bool:
        """Drop a call; True when it was sent already (the device should be told to stop it)."""
        if self._waiting.pop(call_id, None) is not None:
            return False
        if self._sent.get(call_id) is not Purpose.CALL:
            return False  # answered, closed, unknown, or a discovery request
        del self._sent[call_id]
        self._calls_sent -= 1
        return True

    def ready(self) -> list[str]:
        """The frames of the oldest waiting calls that free slots let go now, marked sent."""
        frames = []
        while self._waiting and self._calls_sent < self.max_in_flight:
            call_id = next(iter(self._waiting))
            frames.append(self._waiting.pop(call_id))
            self._sent[call_id] = Purpose.CALL
            self._calls_sent += 1
        return frames

    def close(self) -> list[CallFailed]:
        """Forget everything; fail the calls sent, in id order, then those waiting, in theirs."""
        failed = [
            CallFailed(call_id, "device disconnected during the call", closed=True)
            for call_id in sorted(self.calls)
        ]
        failed.extend(
            CallFailed(call_id, "device disconnected before the call was sent", closed=True)
            for call_id in self._waiting
        )
        self._sent.clear()
        self._calls_sent = 0
        self._waiting.clear()
        return failed


def call_result(call_id: int, reply: Response | ErrorResponse) -> CallSucceeded | CallFailed:
    """The event that the device's ``reply`` to call ``call_id`` makes."""
    if isinstance(reply, ErrorResponse):
        return CallFailed(call_id, reply.message, reply.code)
    if isinstance(reply.result, dict):
        return CallSucceeded(call_id, reply.result)
    return CallFailed(call_id, "malformed result")
