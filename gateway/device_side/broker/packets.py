"""Listener limits for the embedded broker, which amqtt 0.12 cannot configure.

- **Packet size.** amqtt reads a packet's fixed header, then as many bytes as its remaining
  length says (up to 256 MB) into memory before anything looks at them: one 200 MB publish took
  the gateway to 1 GB. ``LimitedBroker`` reads each client through a ``LimitedReader``, and
  ``MQTTFixedHeader.from_stream`` is wrapped (once per process) to check the remaining length of
  packets read from one: a packet over the limit is refused *before its body is read* and the
  client's connection is aborted. Readers of other brokers or clients are left alone.
- **Connections.** amqtt waits for a CONNECT for ever. Each client takes a slot from a
  ``gateway.net.limits.Guard`` (the listener cap, and the per-address cap until its CONNECT is
  accepted), and must have its CONNECT accepted within the handshake deadline.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from amqtt.adapters import StreamReaderAdapter, StreamWriterAdapter
from amqtt.broker import Broker
from amqtt.errors import MQTTError
from amqtt.mqtt.packet import MQTTFixedHeader

from gateway.net.limits import Guard, Slot, ThrottledLog

__all__ = ["LimitedBroker", "LimitedReader", "install_packet_limit"]

logger = logging.getLogger(__name__)
_log = ThrottledLog(logger)


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


class LimitedReader(StreamReaderAdapter):  # type: ignore[misc]  # amqtt is untyped
    """One client's stream, with the largest packet it may send; empty once refused."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_bytes: int
    ) -> None:
        super().__init__(reader)
        self.max_bytes = max_bytes
        self.refused = False
        self.slot: Slot | None = None
        self.deadline: asyncio.Timeout | None = None
        self._writer = writer
        self._headers = 0

    async def read(self, n: int = -1) -> bytes:
        """Read as amqtt asks; nothing after a refusal, so amqtt sees the end of the stream."""
        if self.refused:
            return b""
        data: bytes = await super().read(n)
        return data

    def header_started(self) -> None:
        """amqtt reads a packet's header: from the second on, its CONNECT was accepted."""
        self._headers += 1
        if self._headers == 2:
            if self.deadline is not None:
                self.deadline.reschedule(None)
            if self.slot is not None:
                self.slot.authenticate()

    def refuse(self, length: int) -> None:
        """Drop the client: its packet of ``length`` bytes is over the limit."""
        self.refused = True
        _log.warning(
            "too_big",
            "MQTT client at %s sent a packet of %d bytes, over limits.mqtt_max_packet_bytes "
            "(%d): closed its connection",
            _peer(self._writer),
            length,
            self.max_bytes,
        )
        self._writer.transport.abort()  # its unread body is discarded by the kernel


class LimitedBroker(Broker):  # type: ignore[misc]  # amqtt is untyped
    """amqtt's broker, reading every TCP client through a ``LimitedReader``."""

    def __init__(
        self, config: dict[str, Any], max_packet_bytes: int, guard: Guard | None = None
    ) -> None:
        super().__init__(config)
        self.max_packet_bytes = max_packet_bytes
        self.guard = guard
        self._clients: set[asyncio.StreamWriter] = set()
        install_packet_limit()

    async def shutdown(self) -> None:
        """amqtt's shutdown, then drop clients it never knew (no CONNECT accepted yet)."""
        await super().shutdown()
        for writer in list(self._clients):
            writer.transport.abort()

    async def stream_connected(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, listener_name: str
    ) -> None:
        """amqtt's own ``stream_connected``, with the limited reader, a slot and a deadline."""
        guard = self.guard
        limited = LimitedReader(reader, writer, self.max_packet_bytes)
        if guard is not None:
            limited.slot = guard.admit(writer.transport, deadlines=False)
            if limited.slot is None:
                return  # over a cap: aborted
        timeout = guard.limits.handshake_timeout if guard is not None else None
        self._clients.add(writer)
        try:
            # Cancelling amqtt on the deadline, rather than closing under it, keeps its log quiet.
            async with asyncio.timeout(timeout) as limited.deadline:
                await self._client_connected(listener_name, limited, StreamWriterAdapter(writer))
        except TimeoutError:
            _log.warning("handshake", "mqtt listener: closed a connection from %s: no accepted "
                         "CONNECT within %g s", _peer(writer), timeout)  # fmt: skip
            writer.transport.abort()
        finally:
            self._clients.discard(writer)
            if not writer.transport.is_closing():  # cancelled by a shutdown, say
                writer.transport.abort()
            if limited.slot is not None:
                limited.slot.release()


_ORIGINAL = MQTTFixedHeader.from_stream.__func__


async def _checked_from_stream(cls: type[Any], reader: Any) -> Any:
    limited = reader if isinstance(reader, LimitedReader) else None
    if limited is not None:
        limited.header_started()
    header = await _ORIGINAL(cls, reader)
    if header is not None and limited is not None and header.remaining_length > limited.max_bytes:
        limited.refuse(header.remaining_length)
        # amqtt drops the packet; its next read finds the stream ended and closes the session
        raise MQTTError(f"packet of {header.remaining_length} bytes over the limit")
    return header


def install_packet_limit() -> None:
    """Make amqtt check the packets read by a ``LimitedReader``."""
    if MQTTFixedHeader.from_stream.__func__ is not _checked_from_stream:
        MQTTFixedHeader.from_stream = classmethod(_checked_from_stream)
