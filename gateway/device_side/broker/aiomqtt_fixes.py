"""aiomqtt 2.5 habits on Python 3.11 that the gateway's clients work around, on its public API.

Every reconnecting client of the gateway (its own, ``transports/mqtt/client.py``; the per-device
upstream clients, ``upstream/mqtt_client.py``; the cluster's) checks for a cancellation that
``asyncio.wait_for`` swallowed, and a cancellation lost with a PUBACK is raised after all
(``publish_honouring_cancellation``: the device transport's and the cluster's publishes). The
workarounds that reach into aiomqtt's internals live in ``gateway.compat.aiomqtt``.

``subscribe_all`` subscribes and checks what the broker granted. A node that cannot serve a
subscription yet says so in its SUBACK (a NATS node while JetStream elects a new leader after
another node died refuses for a few seconds), and aiomqtt does not raise for it: the
subscription is asked again until it is granted, and the connection given up past ``patience``
(every client of the gateway: a refused subscription is never silent).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

import aiomqtt
from paho.mqtt.reasoncodes import ReasonCode

__all__ = [
    "cancel_all",
    "honour_cancellation",
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


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until they have ended, cancelling again those that swallowed it
    (``honour_cancellation``)."""
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)


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
