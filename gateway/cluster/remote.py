"""Calls to a WebSocket device that another replica holds, through that replica's bridge.

A ``RemoteSession`` stands in the registry for a device bridged by another replica, so hosts
here list and call it as any other. A call publishes ``tools/call`` to the device's bridge
``down`` topic with an id from this replica's slice (``replica_no << 24 | n``, within int32),
and the owner's bridge publishes the device's reply on ``up``, where this replica finds its own
ids. A call in flight fails at once, with a clear error, when the device leaves, when the owner
replica dies (its last will) or when this replica loses the broker: never at its timeout.

An MQTT device another replica owns is called directly on its own ``down`` topic (``direct``):
its reply comes on its ``up`` topic, which every replica hears (``on_reply`` from the transport).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from gateway.cluster.records import ClusterTopics
from gateway.errors import DeviceToolError, DeviceUnavailable
from gateway.protocol import (
    CallSucceeded,
    ErrorResponse,
    IdAllocator,
    MalformedMessage,
    MessageTooLarge,
    Response,
    classify,
    decode,
    encode,
    make_notification,
    make_request,
    mcp_envelope,
)
from gateway.protocol.pending import call_result

__all__ = ["RemoteCalls", "RemoteSession"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Publish = Callable[[str, bytes], Coroutine[Any, Any, bool]]


@dataclass(slots=True)
class _Call:
    device_id: str
    replica: str
    future: asyncio.Future[JsonObject]
    sent: float = 0.0  # loop time
    direct: bool = False


class RemoteCalls:
    """This replica's calls in flight to devices other replicas hold."""

    def __init__(self, topics: ClusterTopics, ids: range, publish: Publish, max_bytes: int) -> None:
        self._topics = topics
        self._ids = IdAllocator(ids=ids)
        self._publish = publish
        self._max_bytes = max_bytes
        self._calls: dict[int, _Call] = {}
        self._waiting: Counter[str] = Counter()  # device id -> calls in flight to it
        self._cancels: set[asyncio.Task[bool]] = set()

    def use_ids(self, ids: range) -> None:
        """Take request ids from ``ids`` from now on (the replica's slice, once claimed)."""
        self._ids = IdAllocator(ids=ids)

    @property
    def in_flight(self) -> int:
        return len(self._calls)

    async def call(
        self,
        device_id: str,
        replica: str,
        session: str,
        tool: str,
        arguments: JsonObject,
        direct: str | None = None,
    ) -> JsonObject:
        """Call ``tool`` on ``device_id`` through ``replica``'s bridge, or on the ``direct``
        topic (an MQTT device's own); return its result.

        Raises:
            DeviceUnavailable: the broker, the owner replica or the device is gone.
            DeviceToolError: the device answered with an error.
        """
        call_id = self._ids.allocate(self._calls.keys())
        loop = asyncio.get_running_loop()
        future: asyncio.Future[JsonObject] = loop.create_future()
        # A direct call does not go through the owner: its death does not fail the call.
        self._calls[call_id] = _Call(
            device_id, "" if direct else replica, future, loop.time(), direct is not None
        )
        self._waiting[device_id] += 1
        params = {"name": tool, "arguments": arguments}
        frame = encode(mcp_envelope(session, make_request(call_id, "tools/call", params)))
        down = direct or self._topics.bridge(device_id, "down")
        # The call does not wait for the broker's PUBACK: a broker link lost after the frame
        # went out fails the call at once (``fail``), while the publish would wait out
        # aiomqtt's 10 s for an acknowledgement that never comes.
        sent = asyncio.ensure_future(self._publish(down, frame.encode()))
        try:
            await asyncio.wait((sent, future), return_when=asyncio.FIRST_COMPLETED)
            # (failed meanwhile, when the broker went while it was sent: that error stands)
            if not future.done() and sent.done() and not sent.result():
                future.set_exception(
                    DeviceUnavailable(device_id, "this replica is cut from the cluster broker")
                )
            return await future
        finally:
            if not sent.done():
                sent.cancel()
            self._calls.pop(call_id, None)
            self._waiting -= Counter({device_id: 1})  # (a count that reaches 0 goes)
            if future.cancelled() or not future.done():  # the caller gave up: timeout, or left
                self._cancel(down, session, call_id)

    def direct_since(self) -> dict[str, float]:
        """Each device with a direct call in flight: the loop time its oldest was sent (the
        MQTT transport ends them when the device went silent with its broker node)."""
        since: dict[str, float] = {}
        for call in self._calls.values():
            if call.direct and not call.future.done():
                since[call.device_id] = min(call.sent, since.get(call.device_id, call.sent))
        return since

    def _cancel(self, topic: str, session: str, call_id: int) -> None:
        """Tell the device to stop a call nobody waits for now (timeout, or the host left)."""
        params = {"requestId": call_id, "reason": "timed out or cancelled by the caller"}
        frame = encode(mcp_envelope(session, make_notification("notifications/cancelled", params)))
        task = asyncio.create_task(self._publish(topic, frame.encode()))
        self._cancels.add(task)
        task.add_done_callback(self._cancels.discard)

    def on_reply(self, device_id: str, text: str) -> None:
        """A frame the device's owner bridged up (or a direct device sent): settle the call it
        answers, if it is ours."""
        if device_id not in self._waiting:
            # Most frames: an MQTT device's liveness replies and chatter, which every replica
            # hears on its ``up`` topic while only its owner needs them; not even parsed here.
            return
        try:
            message = decode(text, self._max_bytes)
            reply = classify(message.get("payload")) if message.get("type") == "mcp" else None
        except (MalformedMessage, MessageTooLarge):
            logger.debug("bridged frame of %s dropped: not a reply", device_id)
            return
        if not isinstance(reply, Response | ErrorResponse) or not isinstance(reply.id, int):
            return
        call = self._calls.get(reply.id)
        if call is None or call.device_id != device_id or call.future.done():
            return  # another replica's, or one we stopped waiting for
        event = call_result(reply.id, reply)
        if isinstance(event, CallSucceeded):
            call.future.set_result(event.result)
        else:
            call.future.set_exception(DeviceToolError(device_id, event.message, event.code))

    def fail(self, why: str, *, replica: str | None = None, device_id: str | None = None) -> int:
        """Fail at once the calls through ``replica`` or to ``device_id`` (all when neither)."""
        failed = 0
        for call in list(self._calls.values()):
            if replica is not None and call.replica != replica:
                continue
            if device_id is not None and call.device_id != device_id:
                continue
            if not call.future.done():
                call.future.set_exception(DeviceUnavailable(call.device_id, why))
                failed += 1
        return failed


class RemoteSession:
    """The registry's ``DeviceSession`` for a device another replica holds."""

    send_frame = None  # its replica holds the link: a message beside MCP cannot go from here

    def __init__(
        self,
        calls: RemoteCalls,
        device_id: str,
        replica: str,
        session: str,
        direct: str | None = None,
    ) -> None:
        self.device_id = device_id
        self.replica = replica
        self.session = session
        self.direct = direct  # an MQTT device's down topic: called there, not through a bridge
        self._calls = calls

    async def call(self, tool: str, arguments: JsonObject) -> JsonObject:
        return await self._calls.call(
            self.device_id, self.replica, self.session, tool, arguments, self.direct
        )

    async def aclose(self) -> None:
        """Nothing to close here: the device's own replica holds its link."""
