"""aiomqtt 2.5 habits that the gateway's clients work around.

Two on Python 3.11 that every reconnecting client of the gateway works around, used by the
gateway's own client (``transports/mqtt.py``) and by the per-device upstream clients
(``upstream/mqtt_client.py``); a cancellation lost with a PUBACK on Python 3.11
(``publish_honouring_cancellation``: the device transport's and the cluster's publishes); a
socket registered after it closed (``mend_socket_registration``, every client); and
``FleetClient`` for the gateway's own client, which carries every device's messages.

``subscribe_all`` subscribes and checks what the broker granted. A node that cannot serve a
subscription yet says so in its SUBACK (a NATS node while JetStream elects a new leader after
another node died refuses for a few seconds), and aiomqtt does not raise for it: the
subscription is asked again until it is granted, and the connection given up past ``patience``
(every client of the gateway: a refused subscription is never silent).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import aiomqtt
from paho.mqtt.reasoncodes import ReasonCode

__all__ = [
    "FleetClient",
    "cancel_all",
    "consume_disconnect",
    "honour_cancellation",
    "mend_socket_registration",
    "publish_honouring_cancellation",
    "refused",
    "subscribe_all",
]

_REFUSED = 0x80  # SUBACK: the first failure code (MQTT 3.1.1 0x80, MQTT 5 0x80 and above)
_ASK_AGAIN = 0.5  # seconds between two asks of a refused subscription


def honour_cancellation() -> None:
    """Raise ``CancelledError`` if the current task was cancelled but carries on anyway.

    Python 3.11's ``asyncio.wait_for`` (which aiomqtt awaits on connect, subscribe and publish)
    swallows a cancellation that arrives just as its future completes (fixed in 3.12); the task
    still counts it, so a reconnect loop checks here, or it would never stop.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def publish_honouring_cancellation(
    client: aiomqtt.Client, topic: str, payload: bytes, *, qos: int, retain: bool = False
) -> None:
    """``client.publish``, and a cancellation that came with its acknowledgement raised after
    all (``honour_cancellation``).

    aiomqtt awaits the PUBACK with ``asyncio.wait_for``, which on Python 3.11 returns it to a
    task cancelled in the very turn of the loop that brought it, and the cancellation is lost:
    a device session being stopped went back to reading its link, and the gateway's stop
    waited for it for ever.
    """
    await client.publish(topic, payload, qos=qos, retain=retain)
    honour_cancellation()


def consume_disconnect(client: aiomqtt.Client) -> None:
    """Retrieve the error of a connection lost outside message iteration (say, in a subscribe).

    aiomqtt leaves it unretrieved in a private future, and asyncio would log it when collected.
    """
    future = getattr(client, "_disconnected", None)
    if isinstance(future, asyncio.Future) and future.done() and not future.cancelled():
        future.exception()


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until they have ended, cancelling again those that swallowed it
    (``honour_cancellation``)."""
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)


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


def refused(granted: Sequence[int | ReasonCode]) -> bool:
    """Did the broker refuse any subscription of a SUBACK?"""
    return any((code if isinstance(code, int) else code.value) >= _REFUSED for code in granted)


async def subscribe_all(
    client: aiomqtt.Client, subscriptions: Sequence[tuple[str, int]], patience: float
) -> None:
    """Subscribe to each ``(topic, qos)``, asking again for any the broker refuses.

    Raises:
        aiomqtt.MqttError: the connection failed, or a subscription was still refused after
            ``patience`` seconds (the caller moves to another node).
    """
    for topic, qos in subscriptions:
        try:
            async with asyncio.timeout(patience):
                # Polled: the broker tells nothing when it could grant it.
                while refused(await client.subscribe(topic, qos=qos)):  # noqa: ASYNC110
                    await asyncio.sleep(_ASK_AGAIN)
        except TimeoutError:
            raise aiomqtt.MqttError(
                f"the broker refused the subscription to {topic} for {patience:g} s"
            ) from None
