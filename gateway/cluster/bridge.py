"""A WebSocket device's replica bridges it onto the broker, so that every replica can call it.

``Bridge.wrap`` puts a ``BridgedLink`` around the device's link: frames other replicas publish
to ``P/bridge/<id>/down`` go to the device as they are, and each reply the device sends with
an id outside this replica's slice goes up to ``P/bridge/<id>/up`` instead of to the local
session (which would drop it as a reply to no request of its own). The device's presence is a
retained ``P/presence/<id>`` naming this replica, cleared when the link ends.

An MQTT device is ``direct``: this replica owns its session and announces it the same way, but
the others call it on its own topics and hear its replies there, so replies to them are dropped
here, not bridged. A board that serves MCP itself is bridged as a WebSocket device, but held
by the replica the ownership rule picks (cluster/boards.py): ``board`` marks its link.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.cluster.records import ClusterTopics, Presence
from gateway.cluster.replica import id_slice
from gateway.devices.link import DeviceLink, LinkClosed
from gateway.protocol import MAX_REQUEST_ID
from gateway.protocol.envelope import parse_json, stock_reply_id

__all__ = ["Bridge", "BridgedLink"]

logger = logging.getLogger(__name__)

Publish = Callable[[str, bytes, bool], Awaitable[bool]]
_FIRST_SLICE = id_slice(1).start - 1  # ids below every replica's slice


def reply_id(text: str) -> int | None:
    """The id of a JSON-RPC reply inside a device frame; None for anything else.

    A reply framed as stock firmware frames it is routed by the id its head names, unparsed:
    the session that takes it parses it once (a known tools/list page, not at all), and the
    replica it goes up to parses it there. Any other frame naming an id is parsed here, as the
    session parses it (raw control characters allowed). A frame that lies about its id (a
    repeated key) reaches a session that parses another one: only the device's own calls can
    meet it, as the other replicas settle a bridged reply only for its device.
    """
    if '"id"' not in text:
        return None  # most frames carry no id at all: no parse
    request_id = stock_reply_id(text)
    if request_id is None:
        try:
            message = parse_json(text)
        except (ValueError, RecursionError):
            return None
        payload = message.get("payload") if isinstance(message, dict) else None
        if not isinstance(payload, dict) or "method" in payload:
            return None
        request_id = payload.get("id")
        if type(request_id) is not int:
            return None
    # No request of any replica has another id: the session drops such a reply as no one's.
    return request_id if 0 <= request_id <= MAX_REQUEST_ID else None


class BridgedLink:
    """A local device's link, with the frames of other replicas' calls passed through."""

    # Frames pass through ``send`` and ``__aiter__`` (a pushed message would skip the bridge).
    sends_whole = pushes = False

    def __init__(
        self, bridge: Bridge, inner: DeviceLink, device_id: str, direct: bool, board: bool
    ) -> None:
        self.device_id = device_id
        self.inner = inner
        self.direct = direct
        self.board = board
        self._bridge = bridge

    async def send(self, text: str) -> None:
        await self.inner.send(text)

    async def __aiter__(self) -> AsyncIterator[str]:
        async for text in self.inner:
            request_id = reply_id(text)
            if request_id is not None and not self._bridge.ours(request_id):
                if not self.direct:  # the caller of a direct device hears it itself
                    await self._bridge.up(self.device_id, text)
                continue
            yield text

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def fail(self) -> Callable[[], None] | None:
        """How the device's own link fails (the WebSocket: 1011), if it can: a session that
        fails ends as on a single gateway (``DeviceConnection.run``)."""
        return self.inner.fail


class Bridge:
    """The WebSocket devices this replica holds, as the other replicas reach them."""

    def __init__(self, topics: ClusterTopics, replica: str, own_ids: range, publish: Publish):
        self.own_ids = own_ids
        self._topics = topics
        self._replica = replica
        self._publish = publish
        self._links: dict[str, tuple[BridgedLink, str]] = {}  # device id -> link, session id
        self._sends: set[asyncio.Task[None]] = set()

    def ours(self, request_id: int) -> bool:
        """Is a reply with this id for this replica's own sessions? Its slice's, or one
        below every slice: a session opened while this replica caught up from its cache,
        before it had its number, numbers its requests from 1 (as a single gateway)."""
        return request_id in self.own_ids or 0 <= request_id < _FIRST_SLICE

    def held(self) -> dict[str, str]:
        """The devices bridged here now, with their session ids."""
        return {device_id: session for device_id, (_, session) in self._links.items()}

    def held_links(self) -> dict[str, BridgedLink]:
        """The devices bridged here now, with their links."""
        return {device_id: link for device_id, (link, _) in self._links.items()}

    def hand_off(self, device_ids: list[str]) -> None:
        """Close the links of ``device_ids``: they reconnect, through the balancer, elsewhere."""
        for device_id in device_ids:
            held = self._links.get(device_id)
            if held is not None:
                self._later(held[0].aclose())

    def holds(self, device_id: str) -> bool:
        return device_id in self._links

    def session_of(self, device_id: str) -> str | None:
        """The session id of the device bridged here, if it is."""
        held = self._links.get(device_id)
        return held[1] if held is not None else None

    def wrap(
        self,
        link: DeviceLink,
        device_id: str,
        session: str,
        *,
        direct: bool = False,
        board: bool = False,
    ) -> BridgedLink:
        """Bridge ``link`` (until ``release``); say on the broker that it is here."""
        bridged = BridgedLink(self, link, device_id, direct, board)
        self._links[device_id] = (bridged, session)
        self.announce(device_id, session)
        return bridged

    def announce(self, device_id: str, session: str) -> None:
        held = self._links.get(device_id)
        direct = held is not None and held[0].direct
        record = Presence(self._replica, session, time.time(), direct).encode()
        self._later(self._publish(self._topics.presence(device_id), record, True))

    def direct(self, device_id: str) -> bool:
        """Is the device here an MQTT device whose session this replica owns?"""
        held = self._links.get(device_id)
        return held is not None and held[0].direct

    def board(self, device_id: str) -> bool:
        """Is the device here a board that serves MCP itself?"""
        held = self._links.get(device_id)
        return held is not None and held[0].board

    def release(self, link: BridgedLink, *, clear: bool = True) -> None:
        """The link ended: clear its presence (unless another replica announced the device
        since: ``clear`` False), unless a newer link of the device took over."""
        held = self._links.get(link.device_id)
        if held is None or held[0] is not link:
            return
        del self._links[link.device_id]
        if clear:
            self._later(self._publish(self._topics.presence(link.device_id), b"", True))

    async def up(self, device_id: str, text: str) -> None:
        await self._publish(self._topics.bridge(device_id, "up"), text.encode(), False)

    def down(self, device_id: str, payload: bytes) -> None:
        """A frame another replica sent the device: pass it on if the device is here."""
        held = self._links.get(device_id)
        if held is None:
            return  # another replica's device, or one that just left (the caller is told)
        self._later(self._send(held[0], payload.decode(errors="replace")))

    async def _send(self, link: BridgedLink, text: str) -> None:
        try:
            await link.send(text)
        except LinkClosed:
            logger.debug("bridged frame for %s dropped: the link is gone", link.device_id)

    def _later(self, work: Awaitable[object]) -> None:
        async def run() -> None:
            await work

        task = asyncio.create_task(run())
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
