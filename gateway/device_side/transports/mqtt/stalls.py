"""Calls in flight to a device whose broker node died: ended within seconds, not at their timeout.

On a broker cluster a device's node may die while calls to it are in flight, and nothing tells
the gateway soon: the dead node publishes no last will, and the device's reconnect to another
node may wait while the cluster elects new leaders for what the dead node led (NATS
JetStream: 0.9 to 18.8 s measured, docs/cluster.md). So a device that has been asked something
(a call, by this replica's session with it or directly from another replica) and has said
nothing for ``STALLED_AFTER`` seconds is looked at: first the broker nodes (a TCP connection to
each, given ``NODE_PATIENCE``); only when one of them is down does the device get a ``ping``
(``make_probe``, which any device answers), and one that does not answer within
``PING_PATIENCE`` went with its node. Its calls end now, with that reason: the session's link is
closed (its calls fail "device disconnected during the call", and the device is offline until it
reconnects) and the direct calls fail through ``fail``.

An election is no verdict: a node electing still accepts connections, and a device on a live
node answers the ping. A device that answers one request at a time (stock firmware's one MCP
loop) and is busy with a slow tool while another node is down may miss the ping: that call then
fails too, the price of not waiting 30 s for every call to a device on a dead node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from gateway.device_side.transports.mqtt.client import BrokerLogin
from gateway.device_side.transports.mqtt.liveness import Peer

__all__ = ["DirectCalls", "Stalls"]

logger = logging.getLogger(__package__)  # one logger for the whole transport

STALLED_AFTER = 2.0  # seconds a device may be silent, asked something, before it is looked at
NODE_PATIENCE = 1.0  # seconds a node has to accept a TCP connection, else it counts as down
PING_PATIENCE = 1.5  # seconds a device has to answer the ping, when a node is down
_EVERY = 0.5  # seconds between looks
_NODES_EVERY = 1.0  # seconds a look at the nodes holds: at most one connection each a second


class DirectCalls(Protocol):
    """The calls this replica made directly to devices other replicas run (cluster)."""

    def direct_since(self) -> Mapping[str, float]:
        """Each device with a direct call in flight: the loop time its oldest call was sent."""
        ...

    def fail(self, why: str, *, device_id: str | None = None) -> int:
        """Fail at once the calls in flight to ``device_id``."""
        ...


class Stalls:
    """Ends the calls to the devices that went silent with a broker node that died."""

    def __init__(
        self,
        nodes: Sequence[BrokerLogin],
        peers: dict[str, Peer],
        ping: Callable[[str], Awaitable[None]],
        direct: DirectCalls | None,
    ) -> None:
        self._nodes = nodes
        self._peers = peers
        self._ping = ping
        self._direct = direct
        self._down: list[str] = []
        self._looked = -_NODES_EVERY  # loop time of the last look at the nodes

    async def run(self) -> None:
        while True:
            await asyncio.sleep(_EVERY)
            stalled = self._stalled()
            if stalled and (down := await self._nodes_down()):
                await self._verdict(stalled, down)

    def _stalled(self) -> list[str]:
        """The devices asked something and silent since for ``STALLED_AFTER`` seconds."""
        now = asyncio.get_running_loop().time()
        silent = []
        for device_id, peer in self._peers.items():
            link = peer.link
            if link is not None and not link.closed and peer.asked > peer.heard:
                if now - peer.asked >= STALLED_AFTER:
                    silent.append(device_id)
        if self._direct is not None:
            for device_id, since in self._direct.direct_since().items():
                known = self._peers.get(device_id)
                heard = known.heard if known is not None else 0.0
                if now - max(since, heard) >= STALLED_AFTER and device_id not in silent:
                    silent.append(device_id)
        return silent

    async def _nodes_down(self) -> list[str]:
        """The nodes that accept no connection now (looked at once a second at most)."""
        now = asyncio.get_running_loop().time()
        if now - self._looked >= _NODES_EVERY:
            self._looked = now
            answers = await asyncio.gather(*(_accepts(node) for node in self._nodes))
            pairs = zip(self._nodes, answers, strict=True)
            self._down = [f"{node.host}:{node.port}" for node, up in pairs if not up]
        return self._down

    async def _verdict(self, stalled: list[str], down: list[str]) -> None:
        loop = asyncio.get_running_loop()
        asked = loop.time()
        # All at once, and the verdict at PING_PATIENCE whatever the publishes do: this
        # replica's own node may hold them a while as the cluster elects.
        pings = [asyncio.ensure_future(self._ping(device_id)) for device_id in stalled]
        await asyncio.sleep(PING_PATIENCE)
        for ping in pings:
            ping.cancel()
        await asyncio.gather(*pings, return_exceptions=True)  # (LinkClosed: not sent)
        nodes = ", ".join(down)
        for device_id in stalled:
            peer = self._peers.get(device_id)
            if peer is not None and peer.heard >= asked:
                continue  # it answered: alive, and its calls go on
            why = f"device {device_id} stopped answering during the call (broker node {nodes} down)"
            logger.info("%s; its calls end now", why)
            if peer is not None and peer.link is not None and not peer.link.closed:
                peer.link.close()  # the session's calls fail; the device reconnects afresh
            if self._direct is not None:
                self._direct.fail(why, device_id=device_id)


async def _accepts(node: BrokerLogin) -> bool:
    """Does ``node`` accept a TCP connection within ``NODE_PATIENCE``? (No MQTT: closed at
    once. A dead process's port refuses at once; a dead machine lets the connection time out.)"""
    try:
        async with asyncio.timeout(NODE_PATIENCE):
            _, writer = await asyncio.open_connection(node.host, node.port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True
