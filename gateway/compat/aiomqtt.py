"""aiomqtt's private names: its paho socket's registration, its disconnect future, its
pending-call check.

Checked with aiomqtt 2.5.1 over paho-mqtt 2.2.0 (pyproject: ``aiomqtt>=2.5,<2.6``;
aiomqtt 3 drops paho, and with it every name here).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import aiomqtt

__all__ = ["FleetClient", "consume_disconnect", "mend_socket_registration"]


def consume_disconnect(client: aiomqtt.Client) -> None:
    """Retrieve the error of a connection lost outside message iteration (say, in a subscribe).

    aiomqtt leaves it unretrieved in a private future (``_disconnected``), and asyncio would log
    it when collected.
    """
    future = getattr(client, "_disconnected", None)
    if isinstance(future, asyncio.Future) and future.done() and not future.cancelled():
        future.exception()


def mend_socket_registration(client: aiomqtt.Client) -> aiomqtt.Client:
    """Register the socket's reader and writer only if it is still the client's when the loop
    gets to it; returns ``client``.

    paho tells aiomqtt of its socket, possibly from the thread that connects, and aiomqtt
    schedules the registration for later by the descriptor's number taken at once. A connection
    closed in between (a client cancelled while connecting, a node dropping it) then registers
    a closed descriptor (an error raised in the loop) or, the number reused, another socket.
    These are aiomqtt's two callbacks with that check; what they run is aiomqtt's.
    """
    loop = client._loop  # noqa: SLF001
    paho = client._client  # noqa: SLF001

    def failed(exc: Exception) -> None:  # as aiomqtt: a broken socket ends the connection
        disconnected = client._disconnected  # noqa: SLF001
        if not disconnected.done():
            disconnected.set_exception(exc)

    def read() -> None:
        try:
            while True:
                paho.loop_read()
                # an SSL socket may hold decoded bytes paho did not take yet
                pending = getattr(paho.socket(), "pending", None)
                if not (pending and pending() > 0):
                    break
        except Exception as exc:  # noqa: BLE001 (aiomqtt's own rule, kept)
            failed(exc)

    def write() -> None:
        try:
            paho.loop_write()
        except Exception as exc:  # noqa: BLE001
            failed(exc)

    def fileno(sock: Any) -> int:
        """The socket's descriptor while it is open and still the client's; else -1."""
        mine = paho.socket()
        return mine.fileno() if mine is not None and mine is sock else -1

    def on_open(mqtt: Any, userdata: Any, sock: Any) -> None:
        def register() -> None:
            if (fd := fileno(sock)) != -1:
                loop.add_reader(fd, read)
                client._misc_task = loop.create_task(client._misc_loop())  # noqa: SLF001

        loop.call_soon_threadsafe(register)

    def on_register_write(mqtt: Any, userdata: Any, sock: Any) -> None:
        def register() -> None:
            if (fd := fileno(sock)) != -1:
                loop.add_writer(fd, write)

        loop.call_soon_threadsafe(register)

    paho.on_socket_open = on_open
    paho.on_socket_register_write = on_register_write
    return client


class FleetClient(aiomqtt.Client):
    """aiomqtt's client, whose bookkeeping per publish does not grow with those in flight.

    For every publish awaiting its PUBACK, aiomqtt 2.5 walked every call in flight twice (``mid
    in self._pending_calls``, a generator over three dicts; then ``len(list(...))`` for its
    warning): with a storm of devices being discovered, hundreds of the gateway's publishes are
    in flight, and each one paid for all of them. The same checks, on the dicts directly.
    """

    @contextlib.contextmanager
    def _pending_call(self, mid: int, value: Any, pending_dict: dict[int, Any]) -> Iterator[None]:
        calls = (self._pending_subscribes, self._pending_unsubscribes, self._pending_publishes)
        if any(mid in pending for pending in calls):
            msg = f'There already exists a pending call for message ID "{mid}"'
            raise RuntimeError(msg)
        pending_dict[mid] = value
        try:
            in_flight = sum(len(pending) for pending in calls)
            if in_flight > self.pending_calls_threshold:
                self._logger.warning("There are %d pending publish calls.", in_flight)
            yield
        finally:
            with contextlib.suppress(KeyError):
                del pending_dict[mid]
