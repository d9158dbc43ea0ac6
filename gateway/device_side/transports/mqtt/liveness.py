"""What the transport knows of each device, and how it tells the silent from the gone.

Stock firmware sets no last will, so on an external broker the devices known from OTA are probed
every ``probe_interval`` (a ``ping`` any device answers, ``gateway.protocol.make_probe``); one
silent for 2.5 intervals is offline.

Keepalive: some devices count only messages on their own link as a sign that the gateway is
still there, not the broker's MQTT PINGREQ/PINGRESP (py-xiaozhi closes its MQTT link after 120 s
without a message and never comes back). So a device whose link has been silent both ways for
``keepalive_interval`` seconds gets the presence probe, a ``ping`` (docs/protocol.md §2): busy
devices get nothing extra.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass

from gateway.device_side.transports.mqtt.link import MqttLink
from gateway.devices.link import LinkClosed
from gateway.protocol import encode, make_probe, mcp_envelope

__all__ = ["Liveness", "Peer"]

logger = logging.getLogger(__package__)  # one logger for the whole transport

_SILENT_PROBES = 2.5  # probe intervals without a word before a probed device counts as gone
_PROBE_SESSION = "probe"
# Seconds after a reconnect or a device's OTA check-in when it is probed again: a device may
# reach the broker after the gateway did (a broker restart), or a while after its check-in.
_FOLLOW_UP = (1.0, 3.0, 6.0)


@dataclass(slots=True)
class Peer:
    """What the transport knows of one device."""

    link: MqttLink | None = None
    on_broker: bool = False  # the embedded broker says it is connected
    status_online: bool = False  # its retained status says online (it has a last will)
    heard: float = 0.0  # loop time of its last message
    sent: float = 0.0  # loop time of the gateway's last publish to it
    asked: float = 0.0  # loop time of the first call sent to it since it was last heard
    quiet_until: float = 0.0  # loop time before which stray messages open no link
    ended: int = 0  # sessions the gateway ended in a row (the backoff grows with it)
    leaving: bool = False  # cluster: owned elsewhere now; kept until the new owner has it


class Liveness:
    """Probes devices with no last will, and pings links silent both ways."""

    def __init__(
        self,
        peers: dict[str, Peer],
        connected: asyncio.Event,
        publish: Callable[..., Awaitable[None]],  # (device id, text, qos=1)
        forget: Callable[[str], None],
        known: Callable[[], Iterable[str]],
        owns: Callable[[str], bool],
    ) -> None:
        self.probe_now = asyncio.Event()
        self._peers = peers
        self._connected = connected
        self._publish = publish
        self._forget = forget
        self._known = known
        self._owns = owns  # cluster: only the replica that owns a device probes it
        self._probing: set[asyncio.Task[None]] = set()

    def soon(self) -> None:
        """Probe at once, and again a few times over the next seconds (``_FOLLOW_UP``)."""
        self.probe_now.set()
        loop = asyncio.get_running_loop()
        for delay in _FOLLOW_UP:
            loop.call_later(delay, self.probe_now.set)

    def follow(self, device_id: str) -> None:
        """A device just checked in through OTA: probe it a few times as it joins the broker.
        Any replica may: the owner hears the answer on the device's ``up`` topic and opens its
        session (cluster), so a rebooted device is back in seconds, not at the next round."""
        loop = asyncio.get_running_loop()
        for delay in _FOLLOW_UP:
            loop.call_later(delay, lambda: self._later(self._probe_one(device_id)))

    async def ping(self, device_id: str) -> None:
        """Send the device the probe, which any device answers (``LinkClosed``: not sent), at
        QoS 0: a NATS node passes it on at once while JetStream elects, where a QoS 1 message
        (stored in JetStream) waits for the election (stalls.py asks while a node died)."""
        await self._publish(device_id, encode(mcp_envelope(_PROBE_SESSION, make_probe())), qos=0)

    async def _probe_one(self, device_id: str) -> None:
        peer = self._peers.get(device_id)
        if not self._connected.is_set() or (
            peer is not None and peer.link and not peer.link.closed
        ):
            return  # its session is here already
        with contextlib.suppress(LinkClosed):
            await self._publish(device_id, encode(mcp_envelope(_PROBE_SESSION, make_probe())))

    def _later(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.create_task(work)
        self._probing.add(task)
        task.add_done_callback(self._probing.discard)

    async def probe_loop(self, interval: float) -> None:
        """Probe every ``interval`` seconds, or at once when ``probe_now`` is set."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self.probe_now.wait()
            self.probe_now.clear()
            if self._connected.is_set():
                await self._probe_round(interval)

    async def _probe_round(self, interval: float) -> None:
        now = asyncio.get_running_loop().time()
        for device_id, peer in list(self._peers.items()):
            if peer.status_online or peer.on_broker or not self._owns(device_id):
                continue  # it has a last will, or the broker tells, or another replica probes
            if now - peer.heard > _SILENT_PROBES * interval:
                logger.info("device %s did not answer probes; offline", device_id)
                self._forget(device_id)
        probe = encode(mcp_envelope(_PROBE_SESSION, make_probe()))
        for device_id in sorted(set(self._known()) | set(self._peers)):
            known = self._peers.get(device_id)
            if not self._owns(device_id):
                continue
            if known is None or not (known.status_online or known.on_broker):
                with contextlib.suppress(LinkClosed):
                    await self._publish(device_id, probe)

    async def keepalive_loop(self, interval: float) -> None:
        """Ping each link silent both ways for ``interval`` seconds."""
        # Checked four times an interval: a link is pinged after 1 to 1.25 intervals of silence,
        # at a cost of one pass over the devices per check, not one timer per device.
        while True:
            await asyncio.sleep(interval / 4)
            if self._connected.is_set():
                await self._keepalive_round(interval)

    async def _keepalive_round(self, interval: float) -> None:
        now = asyncio.get_running_loop().time()
        # The probe, not a message of its own: stock firmware answers a ``ping`` with an
        # error reply and does nothing else (no voice session, no state change), our firmware
        # answers it, and the session drops the answer as one to no request of its own.
        ping = encode(mcp_envelope(_PROBE_SESSION, make_probe()))
        for device_id, peer in list(self._peers.items()):
            if peer.link is None or peer.link.closed:
                continue
            if now - max(peer.heard, peer.sent) >= interval:
                with contextlib.suppress(LinkClosed):
                    await self._publish(device_id, ping)
