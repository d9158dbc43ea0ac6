"""Two aiomqtt 2.5 habits on Python 3.11 that every reconnecting client of the gateway works around.

Used by the gateway's own client (``transports/mqtt.py``) and by the per-device upstream clients
(``upstream/mqtt_client.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import aiomqtt

__all__ = ["cancel_all", "consume_disconnect", "honour_cancellation"]


def honour_cancellation() -> None:
    """Raise ``CancelledError`` if the current task was cancelled but carries on anyway.

    Python 3.11's ``asyncio.wait_for`` (which aiomqtt awaits on connect, subscribe and publish)
    swallows a cancellation that arrives just as its future completes (fixed in 3.12); the task
    still counts it, so a reconnect loop checks here, or it would never stop.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


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
