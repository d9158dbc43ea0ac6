"""amqtt's per-client queues, their deques made only when used.

amqtt 0.12 (pinned in pyproject.toml) gives every client four ``asyncio.Queue``s: two in its
session (retained messages while offline, deliveries) and two in its protocol handler (pending
SUBSCRIBEs and UNSUBSCRIBEs). Each queue makes three deques and an Event with a fourth at once,
760 bytes a deque: about 12 KB per MQTT device, though a stock device never subscribes and
an online one has nothing retained. ``LeanQueue`` is the same queue whose deques (items,
waiting getters, waiting putters) and ``join`` Event come into being on first use.
``install_lean_queues`` makes amqtt's session and broker handler modules use it, once per
process; the embedded broker is the only user of either in the gateway.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import amqtt.mqtt.protocol.broker_handler
import amqtt.session

__all__ = ["LeanQueue", "install_lean_queues"]


class _OnFirstUse:
    """An attribute made on first read; after that the instance's own value is found first."""

    def __init__(self, make: Any) -> None:
        self._make = make
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value = self._make()
        instance.__dict__[self._name] = value
        return value


_MADE_ON_FIRST_USE = ("_queue", "_getters", "_putters", "_finished")


class LeanQueue(asyncio.Queue[Any]):
    """An ``asyncio.Queue`` that holds no deque and no Event until it needs them."""

    _queue = _OnFirstUse(deque)
    _getters = _OnFirstUse(deque)
    _putters = _OnFirstUse(deque)
    _finished = _OnFirstUse(lambda: _set_event())

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        for name in _MADE_ON_FIRST_USE:  # made by asyncio.Queue: dropped until first used
            self.__dict__.pop(name, None)


def _set_event() -> asyncio.Event:
    # an empty queue has no unfinished task: its join() returns at once, as asyncio's does
    event = asyncio.Event()
    event.set()
    return event


def install_lean_queues() -> None:
    """Make amqtt's sessions and broker handlers make ``LeanQueue``s."""
    for module in (amqtt.session, amqtt.mqtt.protocol.broker_handler):
        if getattr(module, "Queue", None) is not LeanQueue:
            module.Queue = LeanQueue
