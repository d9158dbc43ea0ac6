"""The WebSocket relay: a proxied device's conversation, carried to its voice server and back.

When a proxied device opens its session on ``/xiaozhi/v1/``, ``relay()`` opens the upstream
WebSocket at once (the device allows 10 s for the handshake and 10 s more for the hello,
docs/protocol.md §8.2), with the headers the upstream checks its token against, and only then
accepts the device: an upstream that refuses the session refuses the device's handshake, as its
own server would have; one that cannot be reached gets the device a 5xx (``UpstreamRefused``).
Then, in both directions and in order:

- binary frames (audio, protocol version 1, 2 or 3) are forwarded as received, never decoded;
- text frames that are not MCP (``hello``, ``listen``, ``tts``, ``goodbye``, ...) likewise;
- MCP messages go through the session's ``McpTap``: the upstream's reach the device with their
  ids, the device's replies reach whoever asked, and the gateway's own ``DeviceConnection``
  runs on a ``TappedLink``. A frame the tap did not change is forwarded as the very text
  received.

No frame waits for another: each is sent as it arrives, and each direction holds at most what
the WebSocket libraries buffer (``max_queue`` frames, ``write_limit`` bytes): a slow side
pauses the reading of the other (backpressure), it never grows memory. Either side closing
closes the other; the gateway's own session then ends, failing its pending calls at once. The
gateway going quiet (its discovery timing out, a replaced session) never ends the voice
conversation: ``TappedLink.aclose()`` only detaches the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, Protocol

from starlette.responses import Response
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from gateway.device_side.upstream.fleet import FleetTools
from gateway.device_side.upstream.settings import UpstreamWebSocket, check_websocket_url
from gateway.device_side.upstream.tap import McpTap
from gateway.devices.link import DeviceIdentity, DeviceLink, LinkClosed
from gateway.net.destinations import Destination
from gateway.protocol import MalformedMessage, decode, encode, salvage_error_reply

__all__ = ["ProxiedWebSocket", "RelayedDevice", "TappedLink", "UpstreamRefused", "open_upstream",
           "relay"]  # fmt: skip

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Serve = Callable[[DeviceLink, DeviceIdentity], Coroutine[Any, Any, None]]
_GATEWAY_QUEUE = 16  # text frames for the gateway's session; the device waits beyond that
# A device WebSocket gone: Starlette's errors, or the device socket's (transports)
_CLOSED = (WebSocketDisconnect, RuntimeError, OSError, LinkClosed)


class RelayedDevice(Protocol):
    """What the relay asks of a device's WebSocket: the part of a Starlette ``WebSocket`` it
    uses, which the device socket's ``RelayedSocket`` offers too (transports/websocket.py)."""

    async def receive(self) -> Mapping[str, Any]:
        """The next ASGI message: ``websocket.receive`` (``text`` or ``bytes``), or
        ``websocket.disconnect``."""
        ...

    async def send_text(self, data: str) -> None:
        """Send a text frame."""
        ...

    async def send_bytes(self, data: bytes) -> None:
        """Send a binary frame."""
        ...

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """Close the WebSocket (before it is accepted: refuse it, HTTP 403)."""
        ...


class ProxiedWebSocket(RelayedDevice, Protocol):
    """A proxied device's WebSocket before its conversation opens: its handshake's headers,
    answered once the voice server answered."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The handshake's headers, by lower-case name."""
        ...

    async def accept(self) -> None:
        """Accept the WebSocket (101)."""
        ...

    async def send_denial_response(self, response: Response) -> None:
        """Refuse the handshake with ``response`` (its status and body)."""
        ...


class UpstreamRefused(Exception):
    """The upstream WebSocket could not be opened; the text says why, for the log.

    Attributes:
        status: what the device's handshake is answered: 403 when the server refused it (as
            the server would have), 502 when it cannot be reached, 504 when it was too slow.
    """

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


class TappedLink:
    """The gateway's ``DeviceLink`` to a proxied device: what the tap routes to the gateway."""

    # Detaching is all the gateway's session may do: the device's conversation goes on.
    sends_whole = pushes = False
    fail = None

    def __init__(self, device: RelayedDevice) -> None:
        self._device = device
        self._frames: asyncio.Queue[str | None] = asyncio.Queue()  # bounded by feed()
        self._room = asyncio.Event()
        self._detached = False
        self.hello: str | None = None
        """The device's hello, until its voice server's answer has gone to the device."""

    async def send(self, text: str) -> None:
        """Send one of the gateway's frames to the device."""
        if self._detached:
            raise LinkClosed("the gateway's session on this proxied device ended")
        try:
            await self._device.send_text(text)
        except _CLOSED as exc:
            raise LinkClosed(str(exc)) from None

    async def __aiter__(self) -> AsyncIterator[str]:
        """The device's frames meant for the gateway, until the conversation ends."""
        while (text := await self._frames.get()) is not None:
            self._room.set()
            yield text

    async def aclose(self) -> None:
        """Detach the gateway: the voice conversation goes on without its session."""
        self.detach()

    def detach(self) -> None:
        """``aclose()``, from outside the gateway's session (it ended, however it ended)."""
        self._detached = True
        self._room.set()
        self.end()

    async def feed(self, text: str) -> None:
        """Hand the gateway a device frame; waits while the gateway is that far behind."""
        while self._frames.qsize() >= _GATEWAY_QUEUE and not self._detached:
            self._room.clear()
            await self._room.wait()
        if not self._detached:
            self._frames.put_nowait(text)

    def end(self) -> None:
        """The conversation ended: the gateway's iteration stops after what it has."""
        self._frames.put_nowait(None)


async def open_upstream(
    upstream: UpstreamWebSocket,
    identity: DeviceIdentity,
    device_headers: Mapping[str, str],
    *,
    destination: Destination,
    open_timeout: float,
    max_size: int,
) -> ClientConnection:
    """Open the device's upstream WebSocket with the headers its token is bound to.

    The connection goes to ``destination.address``, the address that was checked; the URL's
    host still names the server (``Host``, and TLS's SNI and certificate check).

    Raises:
        UpstreamRefused: unreachable, too slow, or the handshake was refused.
        UpstreamSettingsError: the URL cannot be opened (one kept by an older gateway: the
            check-in refuses such a URL already).
    """
    check_websocket_url(upstream.url)  # connect() would raise InvalidURI: a traceback, a 500
    token = upstream.token or ""
    headers = {  # as stock firmware sends them (docs/protocol.md §1)
        "Authorization": token if " " in token else f"Bearer {token}",
        "Protocol-Version": device_headers.get("protocol-version") or str(upstream.version),
        "Device-Id": device_headers.get("device-id") or identity.device_id,
        "Client-Id": device_headers.get("client-id") or identity.client_id or "",
    }
    try:
        return await connect(
            upstream.url,
            host=destination.address,  # as checked: never resolved again (DNS rebinding)
            port=destination.port,
            additional_headers=headers,
            open_timeout=open_timeout,
            max_size=max_size,
            compression=None,  # frames go on byte for byte; the device does not deflate either
            proxy=None,  # the device would not use one: reach the server as it would
            user_agent_header=None,
            close_timeout=2,  # a stalled server must not hold the end of a conversation long
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        why = (f"it refused the session (HTTP {status}); if it keeps refusing, reboot the "
               "device so that it checks in again")  # fmt: skip
        raise UpstreamRefused(why, 403) from None
    except TimeoutError:
        raise UpstreamRefused(f"it did not answer within {open_timeout:g} s", 504) from None
    except (OSError, InvalidHandshake) as exc:
        raise UpstreamRefused(f"it cannot be reached ({exc or type(exc).__name__})") from None


async def relay(
    device: RelayedDevice,
    upstream: ClientConnection,
    identity: DeviceIdentity,
    tap: McpTap,
    serve: Serve,
    *,
    max_message_bytes: int,
    fleet: FleetTools | None = None,
    stop: asyncio.Event | None = None,
    ended_with: Callable[[str], None] | None = None,
) -> str:
    """Carry one accepted device conversation to ``upstream`` and back; return how it ended.

    With ``fleet``, the server's listing also offers the fleet's tools and its calls of those
    are the gateway's to make (``FleetTools``). Setting ``stop`` ends the conversation (the
    device was rejected or forgotten). ``ended_with`` hears how it ended before either side is
    closed, so whoever sees the close also sees why.
    """
    link = TappedLink(device)
    gateway = asyncio.create_task(
        serve(link, identity), name=f"gateway.upstream[{identity.device_id}]"
    )
    gateway.add_done_callback(functools.partial(_gateway_ended, link, identity.device_id))
    limit = max_message_bytes
    name = f"gateway.upstream.{{}}[{identity.device_id}]"
    pumps = [
        asyncio.create_task(_device_to_upstream(device, upstream, tap, link, limit, fleet),
                            name=name.format("from_device")),
        asyncio.create_task(
            _upstream_to_device(upstream, device, tap, link, limit, fleet),
            name=name.format("from_server"),
        ),
    ]  # fmt: skip
    if stop is not None:
        pumps.append(asyncio.create_task(_stopped(stop), name=name.format("stop")))
    try:
        done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        ended = next(iter(done)).result()
        if ended_with is not None:
            ended_with(ended)
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        if fleet is not None:
            await fleet.stop()
        link.end()
        await _close_both(device, upstream)
        await asyncio.gather(gateway, return_exceptions=True)
    return ended


async def _stopped(stop: asyncio.Event) -> str:
    await stop.wait()
    return "the gateway ended it (the device was rejected or forgotten)"


def _gateway_ended(link: TappedLink, device_id: str, session: asyncio.Task[None]) -> None:
    # However the gateway's session ended, frames for it must not stop the device's reading.
    link.detach()
    failure = None if session.cancelled() else session.exception()
    if failure is not None:  # gathered with return_exceptions at the end: say it here
        logger.error("device %s: the gateway's session failed; the voice conversation goes "
                     "on without it", device_id, exc_info=failure)  # fmt: skip


async def _device_to_upstream(
    device: RelayedDevice,
    upstream: ClientConnection,
    tap: McpTap,
    link: TappedLink,
    limit: int,
    fleet: FleetTools | None,
) -> str:
    try:
        while True:
            message = await device.receive()
            if message["type"] == "websocket.disconnect":
                return "the device closed the conversation"
            data = message.get("bytes")
            if data is not None:
                await upstream.send(data)
                continue
            text = message.get("text")
            if text is None:
                continue
            mcp = _mcp(text, limit)
            if mcp is None:
                await upstream.send(text)
                if _is_hello(text, limit):
                    link.hello = text  # for the gateway once the voice server has answered it
                continue
            route = tap.from_device(mcp["payload"])
            if route.to_upstream is not None:
                out = route.to_upstream if fleet is None else fleet.from_device(route.to_upstream)
                await upstream.send(_reframe(text, mcp, out))
            if route.to_gateway is not None:
                await link.feed(text)
    except ConnectionClosed:
        return _closed_by_upstream(upstream)
    except _CLOSED:
        return "the device went away"


async def _upstream_to_device(
    upstream: ClientConnection,
    device: RelayedDevice,
    tap: McpTap,
    link: TappedLink,
    limit: int,
    fleet: FleetTools | None,
) -> str:
    try:
        async for frame in upstream:
            if isinstance(frame, bytes):
                await device.send_bytes(frame)
                continue
            mcp = _mcp(frame, limit)
            if mcp is None:
                await device.send_text(frame)  # garbage too: the device judges it as it would
                if link.hello is not None and _is_hello(frame, limit):
                    # The gateway's discovery starts now, after the server's hello: nothing of
                    # the gateway's reaches the device before it (it leaves the answer to the
                    # voice server, DeviceProtocol(answer_hello=False)).
                    hello, link.hello = link.hello, None
                    await link.feed(hello)
                continue
            if fleet is not None and fleet.from_upstream(mcp["payload"]):
                answer = functools.partial(_answer_fleet_call, upstream, mcp)
                busy = fleet.start(mcp["payload"], answer)  # another device's: no wait here
                if busy is not None:
                    await answer(busy)
                continue
            route = tap.from_upstream(mcp["payload"])
            if route.to_device is not None:
                await device.send_text(_reframe(frame, mcp, route.to_device))
            if route.to_upstream is not None:  # the gateway answered for the device
                await upstream.send(encode({**mcp, "payload": route.to_upstream}))
    except ConnectionClosed:
        pass
    except _CLOSED:
        return "the device went away"
    return _closed_by_upstream(upstream)


async def _answer_fleet_call(
    upstream: ClientConnection, message: JsonObject, reply: JsonObject
) -> None:
    with contextlib.suppress(ConnectionClosed):  # the conversation ended meanwhile
        await upstream.send(encode({**message, "payload": reply}))


def _closed_by_upstream(upstream: ClientConnection) -> str:
    # The close frame the server sent, or else ours: a frame over the limit is closed by us.
    frame = upstream.protocol.close_rcvd or upstream.protocol.close_sent
    if frame is None:
        return "the voice server closed the conversation"
    reason = f" ({frame.reason})" if frame.reason else ""
    return f"the voice server closed the conversation with code {frame.code}{reason}"


async def _close_both(device: RelayedDevice, upstream: ClientConnection) -> None:
    with contextlib.suppress(*_CLOSED):
        await device.close()
    await upstream.close()


def _mcp(text: str, limit: int) -> JsonObject | None:
    """``text``'s message if it is MCP, else None (audio control, hello, garbage)."""
    if '"mcp"' not in text:  # most frames: no parse at all
        return None
    message: JsonObject | None
    try:
        message = decode(text, limit)
    except MalformedMessage:
        message = salvage_error_reply(text)  # stock firmware's unescaped error replies
    if message is None or message["type"] != "mcp" or "payload" not in message:
        return None  # no payload to route: passed on as received, the other side judges it
    return message


def _is_hello(text: str, limit: int) -> bool:
    if '"hello"' not in text:  # most frames: no parse at all
        return False
    try:
        return bool(decode(text, limit)["type"] == "hello")
    except MalformedMessage:
        return False


def _reframe(text: str, message: JsonObject, payload: object) -> str:
    """The frame to send on: ``text`` itself when the tap left the payload as it was."""
    if payload is message["payload"]:
        return text
    try:
        return encode({**message, "payload": payload})
    except ValueError:  # NaN or infinity: not JSON to either side, so it goes on as it came
        return text
