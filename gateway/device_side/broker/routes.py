"""Who gets a message published on a topic: subscriptions and retained messages.

A fleet's subscriptions are one exact filter per device (its own ``down`` topic, made by the
broker) and a few wildcard filters of the gateway (``<prefix>/+/up``). Exact filters are a dict
lookup, so routing a message costs the same for 10 or 10,000 devices; only the wildcard filters
are matched one by one. Retained messages are kept per topic (§3.3.1.3), at most one each.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

__all__ = ["Routes", "Subscriber", "matches"]


class Subscriber(Protocol):
    """Whatever takes messages: a client's connection, or the gateway's in-process client."""

    username: str | None

    def deliver(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        """Send one message at ``qos`` (``retain``: it is a retained message sent on subscribe)."""
        ...


def matches(topic_filter: str, topic: str) -> bool:
    """§4.7: does ``topic_filter`` (wildcards ``+`` and ``#``) match ``topic``?"""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False  # §4.7.2: wildcards do not reach $-topics from the first level
    wanted = topic_filter.split("/")
    levels = topic.split("/")
    for n, want in enumerate(wanted):
        if want == "#":
            return True
        if n >= len(levels) or (want != "+" and want != levels[n]):
            return False
    return len(levels) == len(wanted)


def _wild(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


class Routes:
    """The subscription table and the retained messages of one broker."""

    def __init__(self, max_retained_bytes: int = 16 * 1024 * 1024) -> None:
        self._exact: dict[str, dict[Subscriber, int]] = {}
        self._wild: dict[str, dict[Subscriber, int]] = {}
        self.retained: dict[str, tuple[bytes, int]] = {}
        # Retained messages outlive their devices, and anyone can make up device ids (pending
        # ones log in too): topics and payloads kept, in bytes, at most max_retained_bytes.
        self.max_retained_bytes = max_retained_bytes
        self.retained_bytes = 0

    def subscribe(self, subscriber: Subscriber, topic_filter: str, qos: int) -> None:
        """Add (or replace, §3.8.4) ``subscriber``'s subscription to ``topic_filter``."""
        table = self._wild if _wild(topic_filter) else self._exact
        table.setdefault(topic_filter, {})[subscriber] = qos

    def unsubscribe(self, subscriber: Subscriber, topic_filter: str) -> None:
        """Remove one subscription (nothing if there is none)."""
        table = self._wild if _wild(topic_filter) else self._exact
        subscribers = table.get(topic_filter)
        if subscribers is not None and subscribers.pop(subscriber, None) is not None:
            if not subscribers:
                del table[topic_filter]

    def matching(self, topic: str) -> Iterator[tuple[Subscriber, int]]:
        """Each subscriber to ``topic`` with the highest QoS of its matching filters."""
        exact = self._exact.get(topic)
        if not self._wild:  # a fleet's usual case: one lookup
            if exact:
                yield from list(exact.items())
            return
        found: dict[Subscriber, int] = dict(exact) if exact else {}
        for topic_filter, subscribers in list(self._wild.items()):
            if matches(topic_filter, topic):
                for subscriber, qos in subscribers.items():
                    found[subscriber] = max(qos, found.get(subscriber, 0))
        yield from found.items()

    def keep(self, topic: str, payload: bytes, qos: int) -> bool:
        """§3.3.1.3: keep a retained message for later subscribers (empty payload: forget it).

        False if it is not kept: over ``max_retained_bytes`` (the one it replaces is forgotten
        all the same, not left standing as the topic's last word).
        """
        old = self.retained.pop(topic, None)
        if old is not None:
            self.retained_bytes -= len(topic) + len(old[0])
        if not payload:
            return True
        size = len(topic) + len(payload)
        if self.retained_bytes + size > self.max_retained_bytes:
            return False
        self.retained[topic] = (payload, qos)
        self.retained_bytes += size
        return True

    def retained_for(self, topic_filter: str) -> list[tuple[str, bytes, int]]:
        """The retained messages ``topic_filter`` matches, as ``(topic, payload, qos)``."""
        if not _wild(topic_filter):
            kept = self.retained.get(topic_filter)
            return [] if kept is None else [(topic_filter, *kept)]
        return [(t, p, q) for t, (p, q) in self.retained.items() if matches(topic_filter, t)]
