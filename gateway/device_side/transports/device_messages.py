"""A device WebSocket's text messages: made whole from its frames, handed to its connection.

``DeviceMessages`` is the reading half of ``DeviceSocket`` (device_socket.py), in the same
object (an idle fleet holds thousands). A text message, whole once its last fragment came, goes
to the connection in the loop turn it was read when the connection takes each as it comes
(``PushLink.deliver``), else waits in a short queue for ``__aiter__``, reading paused while the
connection is behind. Binary (audio) messages are not kept, unless the socket's conversation is
relayed to a voice server (``keep_binary``): then ``receive`` takes both kinds, in order.

The connection handles a pushed message inside the socket's ``data_received``. A failure there
is the session's, never the listener's: the socket fails the WebSocket (1011) and reads no more,
and ``deliver`` raises it in the session's task, where every session error ends the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from websockets.frames import Frame, Opcode

__all__ = ["DeviceMessages"]

logger = logging.getLogger(__name__)

_QUEUED = 2  # messages waiting for the connection before reading stops
INTERNAL_ERROR = 1011  # RFC 6455 7.4.1: the gateway met a condition it did not expect

Buffer = bytes | bytearray | memoryview


class DeviceMessages:
    """The text messages a device WebSocket reads, pushed to or pulled by its connection."""

    __slots__ = ("_closed", "_deliver", "_failure", "_keep_binary", "_messages", "_parts",
                 "_reading", "_text", "_waiter")  # fmt: skip

    # The socket's (device_socket.py): what this half reads, and how it fails the WebSocket.
    transport: asyncio.Transport
    close_sent: bool
    _drained: asyncio.Future[None] | None
    if TYPE_CHECKING:

        @property
        def remote(self) -> tuple[str, int] | None: ...

        def fail(self, code: int = INTERNAL_ERROR, reason: str = "internal error") -> None: ...

    def __init__(self) -> None:
        self._closed = False  # no more messages come (the connection takes what came)
        self._messages: list[str | bytes] = []  # whole messages not taken yet (text, unless
        # ``keep_binary``)
        self._keep_binary = False
        self._deliver: Callable[[str], None] | None = None  # or takes each as it comes
        self._failure: Exception | None = None  # what taking one raised, for ``deliver``
        self._waiter: asyncio.Future[None] | None = None  # the connection, waiting for one
        self._reading = True
        self._text: bool | None = None  # the message being received is text (None: none is)
        self._parts: list[Buffer] = []  # its fragments so far

    async def deliver(self, receive: Callable[[str], None]) -> None:
        """Give ``receive`` each text message as it arrives, in that loop turn, until the
        WebSocket closes (``PushLink``).

        If ``receive`` raises, the WebSocket is failed (1011) and its exception raised here.
        """
        self._deliver = receive
        try:
            while self._messages:  # what came before the connection started
                message = self._messages.pop(0)
                if isinstance(message, str):
                    receive(message)
            if not self._reading and self._drained is None and not self._closed:
                self._resume_reading()
            while not self._closed:
                waiter = self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await waiter
                finally:
                    self._waiter = None
        except Exception:  # taking what came before: the same failure as one pushed
            self.fail()
            raise
        finally:
            self._deliver = None
            failure, self._failure = self._failure, None  # (its traceback holds this socket)
        if failure is not None:
            raise failure

    async def __aiter__(self) -> AsyncIterator[str]:
        """Yield each text message until the WebSocket closes; binary (audio) ones are not
        kept."""
        while (message := await self.receive()) is not None:
            if isinstance(message, str):
                yield message
            del message  # an idle device must not keep its last message alive

    def keep_binary(self) -> None:
        """Keep binary messages too, for ``receive`` (a conversation relayed to a voice
        server forwards the audio)."""
        self._keep_binary = True

    async def receive(self) -> str | bytes | None:
        """The next message (bytes: a binary one, with ``keep_binary``); None once the
        WebSocket closed and every message came."""
        messages = self._messages
        while not messages:
            if self._closed:
                return None
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        message = messages.pop(0)
        if not self._reading and not messages and not self._closed:
            self._resume_reading()
        return message

    def _data_frame(self, frame: Frame) -> None:
        """A text, binary or continuation frame: a text message goes on once it is whole."""
        if frame.opcode is Opcode.CONT:
            if self._text or self._keep_binary:
                self._parts.append(frame.data)
        else:
            self._text = frame.opcode is Opcode.TEXT
            kept = self._text or self._keep_binary
            self._parts = [frame.data] if kept else []  # audio: not kept
        if frame.fin:
            text, parts, self._parts, self._text = self._text, self._parts, [], None
            if self.close_sent:  # past our close, messages are dropped (as uvicorn)
                return
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            if text:
                self._message(data)
            elif self._keep_binary:
                self._queue(bytes(data))

    def _message(self, data: Buffer) -> None:
        try:
            text = str(data, "utf-8")
        except UnicodeDecodeError:  # RFC 6455 8.1: fail the connection with 1007
            logger.warning("device WebSocket from %s: a text message that is not UTF-8",
                           self.remote)  # fmt: skip
            self.fail(1007, "invalid UTF-8")
            return
        deliver = self._deliver
        if deliver is not None:
            try:
                deliver(text)
            except Exception as exc:  # the session's failure: raised in its task (``deliver``)
                self._failure = exc
                self.fail()  # wakes ``deliver``
            return
        self._queue(text)

    def _queue(self, message: str | bytes) -> None:
        """Keep ``message`` for ``receive``; stop reading while the reader is behind."""
        self._messages.append(message)
        self._wake()
        if self._reading and len(self._messages) >= _QUEUED:  # the connection is behind
            self._reading = False
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        self._reading = True
        self.transport.resume_reading()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
