"""A proxied MQTT device: its link shared by the gateway's session and its voice server.

The device logs in to the gateway's broker (the OTA reply said so, ``mqtt_settings``); the
gateway holds an ``UpstreamMqttClient`` for it with the upstream's credentials, and
``MqttRelay`` sits between the device's link and the gateway's ``DeviceConnection``:

- what the device says goes to the upstream as it came, byte for byte: ``hello`` (transport
  ``udp``), ``goodbye``, ``listen``, ``abort``, and the MCP replies to the upstream's ids; only
  the replies to the gateway's ids (``McpTap``) reach the gateway's session;
- what the upstream says goes to the device as it came: the ``hello`` reply with its ``udp``
  block (server, port, key, nonce) passes unchanged, so the audio flows over UDP between the
  device and the upstream directly, never through the gateway; MCP requests pass the tap
  (the upstream keeps its ids; its ``initialize`` gets the gateway's camera endpoint);
- with fleet tools on (``FleetTools``), the upstream's listing also offers the other devices'
  tools, and its calls of those are made by the gateway, never sent to this device;
- the upstream's connection lost mid-conversation, the gateway ends the conversation on the
  device for it: a ``goodbye`` with the ``session_id`` of the server's hello;
- the relay ending mid-conversation (the device rejected, forgotten, or gone without a
  goodbye), the gateway ends it at the server before it disconnects, with the same
  ``goodbye`` the device would have sent: xiaozhi-esp32-server's MQTT gateway ends a chat
  session only on a goodbye, an error or a keepalive timeout, never on a clean disconnect, and
  would go on speaking to the device over UDP and calling its tools. A device still on the
  gateway's broker gets the goodbye too.

The relay is the link the gateway's session runs over, so the device stays listed and callable
by hosts whatever the upstream does: closed, silent or sending garbage, it costs a log line and
a reconnect with backoff, never the session. The other way round, the gateway ending its
session (discovery gave up, a newer session) only detaches it (``aclose``): the voice relay goes
on until the device leaves. A slow upstream costs only its own device's queues (bounded both
ways); the device going away ends the upstream connection with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from gateway.device_side.broker.aiomqtt_fixes import cancel_all
from gateway.device_side.upstream.fleet import FleetTools
from gateway.device_side.upstream.mqtt_client import UpstreamMqttClient
from gateway.device_side.upstream.mqtt_settings import MqttUpstreams, UpstreamMqtt
from gateway.device_side.upstream.settings import (
    SERVER_MESSAGE_BYTES,
    UpstreamSettingsError,
    check_destination,
    destination_of,
)
from gateway.device_side.upstream.tap import McpTap
from gateway.devices.link import DeviceLink, LinkClosed
from gateway.net.destinations import Destination
from gateway.protocol import encode

__all__ = ["MqttProxies", "MqttRelay"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]

MAX_QUEUED = 64  # upstream messages waiting for the device's down topic; more are dropped
GOODBYE_SECONDS = 2.0  # the relay's end waits this long, at most, for each side's last words


class MqttRelay:
    """The relay of one proxied MQTT device session; ``async with`` runs its upstream side."""

    # The gateway's link to the device (``send``, ``__aiter__``, ``aclose``), over its MqttLink.
    sends_whole = pushes = False
    fail = None

    def __init__(
        self,
        link: DeviceLink,
        device_id: str,
        settings: UpstreamMqtt,
        *,
        vision: dict[str, str] | None = None,
        fleet: FleetTools | None = None,
        max_message_bytes: int = 65536,
        retry: tuple[float, float] = (1.0, 60.0),
        ca_file: Path | None = None,
        status: Callable[[str, str, str], None] | None = None,
        resolve: Callable[[], Awaitable[Destination]] | None = None,
    ) -> None:
        """Relay ``link`` (the device on the gateway's broker) to the upstream of ``settings``.

        Args:
            link: the device's own link.
            device_id: the device.
            settings: its upstream broker, login and topics.
            vision: the gateway's camera endpoint for this session (``McpTap``).
            fleet: the fleet offered to the upstream; None keeps it to the device's tools.
            max_message_bytes: the largest upstream message passed to the device.
            retry: the upstream client's first and longest reconnect waits, in seconds.
            ca_file: extra CAs for a TLS upstream (tests).
            status: told ``(device_id, server, state)`` as the upstream connection changes.
            resolve: where the upstream client connects, checked after resolution.
        """
        self.device_id = device_id
        self.tap = McpTap(vision)
        self._status = status

        def on_state(state: str) -> None:
            if state != "connected":
                self._server_gone()
            if status is not None:
                status(device_id, settings.server, state)

        self.upstream = UpstreamMqttClient(device_id, settings, self._from_upstream, retry=retry,
                                           ca_file=ca_file, on_state=on_state,
                                           resolve=resolve)  # fmt: skip
        self._link = link
        self._fleet = fleet
        self._max_bytes = max_message_bytes
        self._to_device: asyncio.Queue[str] = asyncio.Queue(MAX_QUEUED)
        self._to_gateway: asyncio.Queue[str | None] = asyncio.Queue(MAX_QUEUED)
        self._detached = False  # the gateway's session ended; the voice relay goes on
        self._behind = False  # the device's queue overflowed (said once until it drains)
        self._tasks: set[asyncio.Task[None]] = set()
        self._complaint = ""  # the last kind of upstream garbage logged (once per kind)
        self.session_id: str | None = None
        """The ``session_id`` of the server's hello while a conversation runs, else None."""
        self.device_gone = asyncio.Event()  # set once the device's link has ended
        self.closed = asyncio.Event()  # set once the upstream side has ended

    async def __aenter__(self) -> MqttRelay:
        self._spawn(self.upstream.run(), "upstream")
        self._spawn(self._send_to_device(), "down")
        self._spawn(self._read_device(), "up")
        return self

    async def finished(self) -> None:
        """Wait until the device has left (or a newer relay of the device took over)."""
        name = f"gateway.upstream.{{}}[{self.device_id}]"  # as relay.py's: a task dump names it
        gone = asyncio.create_task(self.device_gone.wait(), name=name.format("device_gone"))
        closed = asyncio.create_task(self.closed.wait(), name=name.format("closed"))
        try:
            await asyncio.wait((gone, closed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            closed.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def stop(self) -> None:
        """End the upstream side: the conversation running (``goodbye``), its connection, its
        queue, the fleet calls it made."""
        try:
            await self._end_conversation()
        finally:  # a cancellation (the gateway stopping) cuts the goodbye short, never the rest
            await cancel_all(self._tasks)
        if self._fleet is not None:
            await self._fleet.stop()
        if not self.closed.is_set() and self._status is not None:
            self._status(self.device_id, self.upstream.settings.server, "idle (device offline)")
        self.closed.set()

    # --- the link the gateway's session runs over ------------------------------------------

    async def send(self, text: str) -> None:
        """Send the gateway's message to the device (its ids never collide with the upstream's)."""
        await self._link.send(text)

    async def __aiter__(self) -> AsyncIterator[str]:
        """Yield what the device says to the gateway (the rest went to the upstream)."""
        while (text := await self._to_gateway.get()) is not None:
            yield text
            del text  # an idle device keeps no message alive

    async def aclose(self) -> None:
        """Detach the gateway's session: the device keeps its voice server until it leaves.

        The gateway ending its session (discovery gave up, a newer session took over) must not
        cut the device off from its voice server (DESIGN.md "Beside a voice server").
        """
        if not self._detached:
            self._detached = True
            _drain(self._to_gateway)
            self._to_gateway.put_nowait(None)

    async def _read_device(self) -> None:
        try:
            async for text in self._link:
                forward = self._from_device(text)
                if forward is not None and not self._detached:
                    await self._to_gateway.put(forward)  # the gateway keeps up, or the device waits
                del text, forward
        finally:
            self.device_gone.set()
            if not self._detached:
                self._detached = True
                _drain(self._to_gateway)
                self._to_gateway.put_nowait(None)  # the gateway's session ends with the device

    # --- device -> upstream, gateway ---------------------------------------------------------

    def _from_device(self, text: str) -> str | None:
        message = _object(text)
        if message is None or message.get("type") != "mcp":
            self.upstream.send(text.encode())  # hello, goodbye, listen...: its server's business
            if message is not None and message.get("type") == "goodbye":
                self.session_id = None
            return None
        payload = message.get("payload")
        route = self.tap.from_device(payload)
        if route.to_upstream is not None:
            out = route.to_upstream
            if self._fleet is not None:
                out = self._fleet.from_device(out)
            self.upstream.send(_rewrap(text, message, payload, out).encode())
        if route.to_gateway is None:
            return None
        return _rewrap(text, message, payload, route.to_gateway)

    # --- upstream -> device ------------------------------------------------------------------

    def _from_upstream(self, raw: bytes) -> None:
        if len(raw) > self._max_bytes:
            self._garbage(f"a message of {len(raw)} bytes (more than {self._max_bytes})")
            return
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            self._garbage("a message that is not UTF-8")
            return
        message = _object(text)
        if message is None:
            self._garbage("a message that is not a JSON object")
            return
        if message.get("type") == "mcp":
            payload = message.get("payload")
            if self._fleet is not None and self._fleet.from_upstream(payload):
                assert isinstance(payload, dict)
                answer = functools.partial(self._answer_fleet_call, message)
                busy = self._fleet.start(payload, answer)
                if busy is not None:
                    self.upstream.send(encode({**message, "payload": busy}).encode())
                return
            route = self.tap.from_upstream(payload)
            if route.to_device is None:
                return
            text = _rewrap(text, message, payload, route.to_device)
        elif message.get("type") in ("hello", "goodbye"):
            sid = message.get("session_id")  # its goodbye, if the gateway must say it for it
            self.session_id = sid if message["type"] == "hello" and isinstance(sid, str) else None
        self._queue_for_device(text)

    def _server_gone(self) -> None:
        """The server's connection is lost: end its conversation on the device for it.

        Since May 2026 the firmware ignores a goodbye without its session's exact id.
        """
        if self.session_id is not None:
            goodbye = _goodbye(self.session_id)
            self.session_id = None
            self._queue_for_device(goodbye)

    async def _end_conversation(self) -> None:
        """End the conversation running, if one is, on both sides: its ``goodbye`` to the
        server, and what the device said last (its own goodbye, say) sent before the
        connection closes; then the goodbye to a device still here."""
        goodbye = None
        if self.session_id is not None:
            goodbye = _goodbye(self.session_id)
            self.session_id = None
        connected = self.upstream.connected.is_set()
        if connected and goodbye is not None:
            self.upstream.send(goodbye.encode())
        if connected and not await self.upstream.flush(GOODBYE_SECONDS):
            logger.warning("device %s: its upstream %s did not take the device's last messages "
                           "within %g s", self.device_id, self.upstream.settings.where,
                           GOODBYE_SECONDS)  # fmt: skip
        if goodbye is not None and not self.device_gone.is_set():
            with contextlib.suppress(LinkClosed, TimeoutError):
                async with asyncio.timeout(GOODBYE_SECONDS):
                    await self._link.send(goodbye)

    def _queue_for_device(self, text: str) -> None:
        try:
            self._to_device.put_nowait(text)
        except asyncio.QueueFull:
            if not self._behind:  # once until the device catches up, not per message
                self._behind = True
                logger.warning("device %s does not keep up with its upstream; its messages are "
                               "dropped", self.device_id)  # fmt: skip

    async def _answer_fleet_call(self, message: JsonObject, reply: JsonObject) -> None:
        self.upstream.send(encode({**message, "payload": reply}).encode())

    async def _send_to_device(self) -> None:
        while True:
            text = await self._to_device.get()
            try:
                await self._link.send(text)
            except LinkClosed:
                return  # the session ends; the relay with it
            self._behind = False

    def _garbage(self, what: str) -> None:
        if what != self._complaint:  # once per kind, not for every message of a flood
            self._complaint = what
            logger.warning("device %s: its upstream %s sent %s; dropped", self.device_id,
                           self.upstream.settings.where, what)  # fmt: skip

    def _spawn(self, work: Any, name: str) -> None:
        task = asyncio.create_task(work, name=f"gateway.upstream[{self.device_id}].{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _goodbye(session_id: str) -> str:
    """The ``goodbye`` of the conversation ``session_id``, as stock firmware sends it (since
    May 2026 it ignores one without its session's exact id)."""
    return json.dumps({"session_id": session_id, "type": "goodbye"}, separators=(",", ":"))


def _drain(queue: asyncio.Queue[str | None]) -> None:
    while not queue.empty():
        queue.get_nowait()


def _object(text: str) -> JsonObject | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _rewrap(text: str, message: JsonObject, payload: object, routed: object) -> str:
    """``text`` itself when the payload went through unchanged, else the message re-encoded."""
    return text if routed is payload else encode({**message, "payload": routed})


class MqttProxies:
    """Which MQTT device sessions run through their upstream, and the relay of each."""

    def __init__(
        self,
        upstreams: MqttUpstreams,
        *,
        ota_url: Callable[[str], str | None] = lambda device_id: None,
        fleet: Callable[[str, str], FleetTools] | None = None,
        taps: dict[str, McpTap] | None = None,
        enders: dict[str, Callable[[], None]] | None = None,
        status: Callable[[str, str, str], None] | None = None,
        max_message_bytes: int = 65536,
        retry: tuple[float, float] = (1.0, 60.0),
    ) -> None:
        """Relay the devices that have an upstream in ``upstreams``.

        Args:
            upstreams: the upstream settings the OTA proxy kept, by device.
            ota_url: the voice server a device is proxied to now, None when it is not (the
                config may have turned it off since).
            fleet: makes the fleet offered to a device's upstream, from the device id and the
                server's name; None offers none.
            taps: where each live relay's tap is kept, by device (the camera forwarder reads
                the upstream's vision URL there).
            enders: where what ends each live relay is kept, by device (a rejected device).
            status: told ``(device_id, server, state)`` as an upstream connection changes.
            max_message_bytes: the largest upstream message passed to a device.
            retry: the upstream clients' first and longest reconnect waits, in seconds.
        """
        self.upstreams = upstreams
        self.retry = retry
        self._ota_url = ota_url
        self._fleet = fleet
        self._taps = taps if taps is not None else {}
        self._enders = enders if enders is not None else {}
        self._status = status
        self._max_bytes = max(max_message_bytes, SERVER_MESSAGE_BYTES)
        self._relays: dict[str, MqttRelay] = {}

    def _allowed(self, device_id: str, settings: UpstreamMqtt, ota_url: str) -> bool:
        try:  # kept by an older gateway, or the config changed: as a WebSocket conversation
            check_destination(settings.server, ota_url)
        except UpstreamSettingsError as exc:
            logger.warning("device %s: its voice server's broker %s: %s; the device is served "
                           "without it", device_id, settings.where, exc)  # fmt: skip
            if self._status is not None:
                self._status(device_id, settings.server, str(exc))
            return False
        return True

    def relay_of(self, device_id: str) -> MqttRelay | None:
        """The live relay of ``device_id`` (None when it is not relayed now)."""
        return self._relays.get(device_id)

    @asynccontextmanager
    async def relay(
        self, link: DeviceLink, device_id: str, vision: dict[str, str] | None
    ) -> AsyncIterator[DeviceLink]:
        """The link the gateway's session runs over: a relay if the device has an upstream."""
        ota_url = self._ota_url(device_id)
        settings = self.upstreams.get(device_id) if ota_url else None
        if settings is not None and not self._allowed(device_id, settings, ota_url or ""):
            settings = None
        if settings is None:
            yield link
            return
        old = self._relays.get(device_id)
        if old is not None:  # the device came back: one login at the upstream, never two
            await old.stop()
        fleet = self._fleet(device_id, settings.server) if self._fleet is not None else None
        relay = MqttRelay(link, device_id, settings, vision=vision, fleet=fleet,
                          max_message_bytes=self._max_bytes, retry=self.retry,
                          status=self._status,
                          resolve=functools.partial(destination_of, settings.server,
                                                    ota_url or ""))  # fmt: skip
        self._relays[device_id] = relay
        self._taps[device_id] = relay.tap
        self._enders[device_id] = relay.closed.set  # finished() returns: the relay stops
        try:
            async with relay:
                yield relay
        finally:
            if self._relays.get(device_id) is relay:
                del self._relays[device_id]
            if self._taps.get(device_id) is relay.tap:
                del self._taps[device_id]
            if self._enders.get(device_id) == relay.closed.set:
                del self._enders[device_id]
