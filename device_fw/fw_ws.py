"""A small WebSocket client (RFC 6455) on asyncio streams.

Stock MicroPython has only the low-level server-side ``websocket`` module, so this is ours:
the opening handshake (an HTTP/1.1 upgrade over fw_http's connection), masked text frames,
ping/pong, close, and TLS (wss://) where the port has ssl. It runs unchanged on CPython.

    ws = await connect("ws://gw:8765/xiaozhi/v1/", [("Device-Id", "aa:bb:...")])
    await ws.send("hello")
    message = await ws.recv()  # str, bytes, or None once closed
"""

import asyncio
import binascii
import hashlib
import struct

import fw_compat as compat
from fw_http import open_stream, read_head, request_head

TEXT, BINARY, CLOSE, PING, PONG = 1, 2, 8, 9, 10
MAX_MESSAGE = 65536  # the gateway's default limit; bigger incoming messages close with 1009
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class HandshakeError(Exception):
    """The server refused the upgrade; ``status`` is its HTTP status (0: not HTTP at all)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _mask(data, key):
    # XOR through one big integer: far faster than a byte loop in MicroPython bytecode.
    size = len(data)
    if not size:
        return b""
    pad = int.from_bytes((key * (size // 4 + 1))[:size], "big")
    return (int.from_bytes(data, "big") ^ pad).to_bytes(size, "big")


async def connect(url, headers=(), timeout=10):
    """Open a WebSocket; HandshakeError if refused, OSError if unreachable.

    ``headers`` are (name, value) pairs sent in order after the standard ones.
    """
    reader, writer, path, host = await open_stream(url, timeout, ("ws", "wss"))
    try:
        await compat.wait_for(_handshake(reader, writer, path, host, headers), timeout)
    except BaseException:
        compat.abort(writer)
        raise
    return WebSocket(reader, writer)


async def _handshake(reader, writer, path, host, headers):
    key = binascii.b2a_base64(compat.urandom(16)).strip()
    standard = [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                ("Sec-WebSocket-Key", key.decode()), ("Sec-WebSocket-Version", "13")]  # fmt: skip
    writer.write(request_head("GET", path, host, standard + list(headers)))
    await writer.drain()
    status, status_line, answer = await read_head(reader)
    if status != 101:
        raise HandshakeError(status, "WebSocket upgrade refused: " + status_line)
    expected = binascii.b2a_base64(hashlib.sha1(key + _GUID).digest()).strip().decode()
    if answer.get("sec-websocket-accept") != expected:
        raise HandshakeError(status, "bad Sec-WebSocket-Accept in the server's answer")


class WebSocket:
    """One open client connection.

    ``timeout``: seconds recv() waits for the next frame before it calls the peer dead (None:
    forever); the link sets it a little above its ping interval, so a live peer always beats it.
    """

    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.closed = False
        self.timeout = None
        self._lock = asyncio.Lock()

    async def recv(self):
        """The next message (str for text, bytes for binary), or None once closed."""
        parts = []
        kind = TEXT
        size = 0
        while not self.closed:
            try:
                fin, opcode, data = await compat.wait_for(self._frame(), self.timeout)
            except (OSError, EOFError, asyncio.TimeoutError) as exc:
                compat.log(compat.INFO, "WebSocket lost: %r", exc)
                self.abort()
                return None
            if opcode == PING:
                await self._send_quietly(PONG, data)
            elif opcode == CLOSE:
                # 5.5.1: answer a close with a close (echo the code), then drop the TCP link.
                await self._send_quietly(CLOSE, data[:2])
                self.abort()
            elif opcode != PONG:
                if opcode:  # a new message; 0 continues a fragmented one
                    kind, parts, size = opcode, [], 0
                parts.append(data)
                size += len(data)
                if size > MAX_MESSAGE:
                    await self.close(1009)
                elif fin:
                    message = b"".join(parts)
                    if kind != TEXT:
                        return message
                    try:
                        return message.decode()
                    except UnicodeError:
                        await self.close(1007)
        return None

    async def _frame(self):
        read = self.reader.readexactly
        first, second = await read(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack("!H", await read(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", await read(8))[0]
        if size > MAX_MESSAGE:
            raise OSError("a %d-byte frame is over the limit" % size)
        key = await read(4) if second & 0x80 else None
        data = await read(size) if size else b""
        return first & 0x80, first & 0x0F, _mask(data, key) if key else data

    async def send(self, text):
        """Send one text frame; OSError if the connection is gone."""
        await self._send(TEXT, text.encode())

    async def ping(self, data=b""):
        """Send a ping; the peer's pong (or any frame) keeps recv() from timing out."""
        await self._send(PING, data)

    async def close(self, code=1000):
        """Send a close frame, then drop the connection."""
        if not self.closed:
            await self._send_quietly(CLOSE, struct.pack("!H", code))
            self.abort()

    def abort(self):
        """Drop the connection now, with no close frame (like a board losing power)."""
        if not self.closed:
            self.closed = True
            compat.abort(self.writer)

    async def _send(self, opcode, data):
        if self.closed:
            raise OSError("WebSocket closed")
        size = len(data)
        if size < 126:
            head = bytes((0x80 | opcode, 0x80 | size))
        elif size < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 0xFE, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0xFF, size)
        key = compat.urandom(4)  # 5.3: clients mask every frame with a fresh key
        async with self._lock:  # two concurrent drains would send the same buffer twice
            self.writer.write(head + key + _mask(data, key))
            await self.writer.drain()

    async def _send_quietly(self, opcode, data):
        try:
            await self._send(opcode, data)
        except OSError:
            pass
