"""The device WebSocket below ASGI: one protocol from handshake to close, and it is the link.

Through uvicorn, a device WebSocket pays for the ASGI layers on websockets' sans-I/O
``ServerProtocol``: a scope, a ``run_asgi`` task, a Starlette ``WebSocket``, a message dict per
frame and the awaits that pass it along. ``DeviceSocket`` stands on ``ServerProtocol`` directly
(as uvicorn's websockets-sansio protocol does) with none of them: a text message goes from
``data_received`` to its connection in the same loop turn (``PushLink.deliver``), and a send goes
straight to the transport. It keeps what uvicorn gave the device WebSocket (docs/architecture.md
"The device WebSocket"): the handshake's answers, the listener's guard (``Guarded``), the size
limit (1009), the ``Keepalive`` wheel, backpressure both ways, close handling and shutdown.
``DeviceSockets`` (transports/websocket.py) makes one per handshake on the device path and runs
its ``Endpoint`` (authenticate, settle, accept, serve) in one task, awaited on shutdown. What the
device reads in, its text messages, is ``DeviceMessages`` (device_messages.py), the same object.

It asks of websockets only its documented sans-I/O API (``receive_data``, ``events_received``,
``send_*``, ``data_to_send`` after each of them, ``state``, ``close_expected``, ``logger``). A
call's text frame each way is read or written in place (gateway/net/text_frames.py) where the
socket itself knows that is what websockets would do: the bytes it fed ``receive_data`` say
where the next frame starts (``FrameBoundary``), its own 101 says no extension was negotiated,
its own config the size limit, and nothing of websockets' waits to be sent.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import OPEN
from websockets.server import ServerProtocol

from gateway.compat.uvicorn import ServerState
from gateway.device_side.transports.device_messages import INTERNAL_ERROR, DeviceMessages
from gateway.devices.link import LinkClosed
from gateway.net.limits import Guarded, Slot
from gateway.net.text_frames import FrameBoundary, text_frame, whole_text_frame
from gateway.net.websocket import Keepalive

__all__ = ["CLOSE_TIMEOUT", "DeviceSocket", "Endpoint"]

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT = 10.0  # s our close waits for the device's echo (uvicorn's close_timeout)

Endpoint = Callable[["DeviceSocket"], Awaitable[None]]
"""Serves one device WebSocket: ``refuse()`` it, or ``accept()`` it and use it as the link."""


class DeviceSocket(DeviceMessages, asyncio.Protocol, Guarded):
    """One device WebSocket: the asyncio protocol, and the ``DeviceLink`` of its connection."""

    __slots__ = ("_drained", "_endpoint", "_frames", "_keepalive", "_max_size", "_plain",
                 "_state", "close_sent", "close_timer", "conn", "handshake_complete",
                 "keepalive_slot", "pending_ping_payload", "ping_sent_at", "request", "response",
                 "slot", "transport")  # fmt: skip

    # A frame is written whole or not at all, even when the send is cancelled (see ``send``).
    sends_whole = True
    pushes = True  # a ``PushLink`` (device_messages.py: ``deliver``; ``write_now``)

    def __init__(
        self,
        endpoint: Endpoint,
        state: ServerState,
        conn: ServerProtocol,
        keepalive: Keepalive | None,
        max_size: int | None,
    ) -> None:
        super().__init__()
        self._endpoint = endpoint
        self._state = state
        self.conn = conn
        self._keepalive = keepalive
        self._max_size = max_size  # what ``conn`` was made with: longer messages close (1009)
        self._frames = FrameBoundary()  # where websockets' parser stands in what we fed it
        # Text frames read and written in place (text_frames.py), not through websockets:
        # once the handshake is accepted with no extension, and websockets logs no frames.
        self._plain = False
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # connection_made
        self.slot: Slot | None = None
        self.request: Request | None = None  # until the endpoint accepts or refuses
        self.response: Response | None = None
        self.handshake_complete = self.close_sent = False
        self.close_timer: asyncio.TimerHandle | None = None
        self.keepalive_slot: int | None = None
        self.pending_ping_payload: bytes | None = None
        self.ping_sent_at = 0.0
        self._drained: asyncio.Future[None] | None = None  # while the transport's buffer is full

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a socket's: a Transport
        self._state.connections.add(self)  # type: ignore[arg-type]  # uvicorn calls .shutdown()

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if self._in_place() and self._frames.between_messages:  # a call's reply, say
            text = whole_text_frame(data, self._max_size)  # one whole text frame: read here
            if text is not None:
                self._message(text)
                return
        self._frames.feed(data)
        conn.receive_data(data)
        # Whatever websockets queued in answer (a pong, a close) goes out now: nothing of its
        # own is ever waiting when a frame is written in place (``send``).
        self._write()
        for event in conn.events_received():
            if isinstance(event, Frame):
                self._frame(event)
            elif isinstance(event, Request):
                self._request(event)
        # websockets failed the connection (RFC 6455 7.1.7) with the close frame its parser
        # chose (1002, 1009), written above: the socket closes too.
        if self.handshake_complete and conn.close_expected() and not self.close_sent:
            self._closing()

    def _in_place(self) -> bool:
        """Text frames may be read and written here (text_frames.py), not by websockets."""
        return self._plain and self.conn.state is OPEN

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()
        if self._deliver is not None and self._reading:  # what it sends may need answers
            self._reading = False
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)
        if self._deliver is not None and not self._reading and not self._closed:
            self._resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_keepalive()
        self._state.connections.discard(self)
        self.handshake_complete = self._closed = True
        self._end()
        self.resume_writing()  # a lost transport never drains: no send waits forever
        if self.close_timer is not None:
            self.close_timer.cancel()
            self.close_timer = None
        if self.slot is not None:
            self.slot.release()
        if exc is None:
            self.transport.close()

    def shutdown(self) -> None:
        """The listener stops (uvicorn calls this on every connection it tracks)."""
        self._stop_keepalive()
        if self.handshake_complete and not self.close_sent:
            self.conn.send_close(1012)  # service restart
        elif not self.handshake_complete:  # the endpoint has not answered: as uvicorn does
            self.handshake_complete = True
            self.conn.send_response(self.conn.reject(500, "Internal Server Error"))
        self._closing()

    @property
    def remote(self) -> tuple[str, int] | None:
        """The device's address and port."""
        peer = self.transport.get_extra_info("peername")
        return (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and peer else None

    def refuse(self, status: int = HTTPStatus.FORBIDDEN, text: str = "") -> None:
        """Answer the handshake with HTTP ``status`` (403), ``text`` its body, and close."""
        if self.handshake_complete:
            return
        self._release_handshake()
        self.handshake_complete = True
        self.conn.send_response(self.conn.reject(status, text))
        self._closing()

    def accept(self) -> bool:
        """Answer the handshake with 101 and start the keepalive; False if the device left."""
        response = self.response
        if self.handshake_complete or response is None or self.transport.is_closing():
            return False
        # As uvicorn: its own date and server headers in place of the parser's date.
        del response.headers["Date"]
        for name, value in self._state.default_headers:
            response.headers[name.decode("latin-1")] = value.decode("latin-1")
        self.handshake_complete = True
        self.conn.send_response(response)
        self._write()
        # Our own answer says whether an extension (permessage-deflate) was negotiated; and
        # whether websockets logs frames is its logger's level (both public).
        self._plain = "Sec-WebSocket-Extensions" not in response.headers and not (
            self.conn.logger.isEnabledFor(logging.DEBUG)
        )
        self._release_handshake()
        if self.slot is not None:
            self.slot.authenticate()
        if self._keepalive is not None:
            self._keepalive.add(self)
        return True

    async def send(self, text: str) -> None:
        """Send one text frame; raise ``LinkClosed`` if the WebSocket is closed or closing.

        A full transport buffer is waited out before anything is written, so a send cancelled
        while it waits has written nothing.
        """
        await self._writable()
        # A tools/call, framed here, not by websockets: nothing of websockets' own waits to
        # go before it (``_write`` follows each of its operations), and no message of ours is
        # in fragments (we send none).
        if self._in_place():
            self.transport.write(text_frame(text.encode()))
            return
        try:
            self.conn.send_text(text.encode())
        except InvalidState:
            raise LinkClosed("the device WebSocket is closing") from None
        self._write()

    async def send_bytes(self, data: bytes) -> None:
        """Send one binary frame (a relayed voice server's audio), as ``send`` sends text."""
        await self._writable()
        try:
            self.conn.send_binary(data)
        except InvalidState:
            raise LinkClosed("the device WebSocket is closing") from None
        self._write()

    async def _writable(self) -> None:
        """Wait while the transport's buffer is full; raise ``LinkClosed`` once closed."""
        while self._drained is not None and not self._closed:
            await asyncio.shield(self._drained)
        if self._closed or self.close_sent:
            raise LinkClosed("the device WebSocket is closed")

    def write_now(self, texts: list[str]) -> int:
        """Send ``texts`` as text frames if the transport's buffer has room, in one write (a
        joining device's hello answer and initialize: one send, not two); return how many."""
        if self._drained is not None or self._closed or self.close_sent:
            return 0
        conn = self.conn
        if self._in_place():
            self.transport.write(b"".join([text_frame(text.encode()) for text in texts]))
            return len(texts)
        sent = 0
        try:
            for text in texts:
                conn.send_text(text.encode())
                sent += 1
        except InvalidState:
            pass  # closing: the connection's sender finds the link closed
        self._write()
        return sent

    async def aclose(self) -> None:
        """Close the WebSocket (1000) if it is open; its messages end at once."""
        if not self.handshake_complete:
            self.refuse()
            return
        if self.close_sent or self._closed or self.transport.is_closing():
            self._end()
            return
        try:
            self.conn.send_close(1000, "")
        except InvalidState:
            pass
        self._write()
        self.close_sent = True
        self._end()
        self._stop_keepalive()
        if not self._reading:  # the device's echo must get through
            self._resume_reading()
        loop = asyncio.get_running_loop()
        self.close_timer = loop.call_later(CLOSE_TIMEOUT, self.transport.close)

    def send_ping(self, now: float) -> None:
        """Send a ping whose pong the keepalive waits for."""
        # A random payload tells this ping's pong from stale or unsolicited ones (as uvicorn).
        self.pending_ping_payload = struct.pack("!I", random.getrandbits(32))
        self.ping_sent_at = now
        self.conn.send_ping(self.pending_ping_payload)
        self._write()

    def keepalive_timeout(self) -> None:
        """No pong within the ping timeout: fail the connection (1011), as uvicorn does."""
        self.pending_ping_payload = None
        self.fail(INTERNAL_ERROR, "keepalive ping timeout")

    def fail(self, code: int = INTERNAL_ERROR, reason: str = "internal error") -> None:
        """Fail the WebSocket at once with ``code`` (RFC 6455 7.1.7): nothing more is read."""
        if self.close_sent or self.transport.is_closing():
            return
        self.conn.fail(code, reason)
        self._closing()

    def _request(self, request: Request) -> None:
        self.response = response = self.conn.accept(request)
        if response.status_code != 101:  # not a valid WebSocket handshake: 400, 426
            self.handshake_complete = self.close_sent = True
            self.conn.send_response(response)
            self._write()
            self.transport.close()
            return
        self.request = request
        task = asyncio.get_running_loop().create_task(self._run())
        self._state.tasks.add(task)
        task.add_done_callback(self._state.tasks.discard)

    async def _run(self) -> None:
        try:
            await self._endpoint(self)
        except Exception:  # one device's failure is its own: logged, its socket closed
            logger.exception("device WebSocket from %s failed", self.remote)
            if self.handshake_complete:
                self.fail()
            else:
                self.handshake_complete = True
                self.conn.send_response(self.conn.reject(500, "Internal Server Error"))
                self._write()
        finally:
            if self.close_timer is None:
                self.transport.close()

    def _frame(self, frame: Frame) -> None:
        opcode = frame.opcode  # a ping's pong went out with what the parser queued
        if opcode is Opcode.PONG:
            self._pong(frame)
        elif opcode is Opcode.CLOSE:
            self._close_received()
        elif opcode is not Opcode.PING:  # TEXT, BINARY, CONT
            self._data_frame(frame)

    def _pong(self, frame: Frame) -> None:
        if self.pending_ping_payload is None or bytes(frame.data) != self.pending_ping_payload:
            return  # unsolicited or stale
        self.pending_ping_payload = None
        if self._keepalive is not None and not self.close_sent:
            self._keepalive.answered(self)

    def _close_received(self) -> None:
        if self.close_sent:  # the echo of our close: the closing handshake is complete
            if self.close_timer is not None:
                self.close_timer.cancel()
                self.close_timer = None
            self.transport.close()
            return
        self.close_sent = True  # the echo the parser queued went out with it
        self._end()
        self.transport.close()

    def _end(self) -> None:
        """No more messages: the connection's iteration ends once it took what came."""
        self._closed = self._closed or self.close_sent
        self._stop_keepalive()
        self._wake()

    def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive.remove(self)
        self.pending_ping_payload = None

    def _release_handshake(self) -> None:
        # websockets' parser keeps the request in its frame for the connection's life: empty
        # its headers (nothing reads them again), about 1.3 KB an idle device.
        if self.request is not None:
            self.request.headers.clear()
        self.request = self.response = None

    def _closing(self) -> None:
        """Write what the parser queued (a close frame), end the messages, close."""
        self._write()
        self.close_sent = True
        self._end()
        self.transport.close()

    def _write(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.transport.write(b"".join(data))
