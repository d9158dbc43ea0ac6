"""amqtt's subscription table, mended so that a client's work does not grow with the fleet.

amqtt 0.12 (pinned in pyproject.toml) keeps one table, topic filter -> subscribers, and each
device has a filter of its own (its ``down`` topic). Left as it is, the table costs O(devices)
per message and per connection, O(devices²) for a fleet arriving, and it breaks:

- ``_run_broadcast`` awaits inside ``for ... in self._subscriptions.items()`` while other
  clients' connects add or remove subscriptions: the broadcast task then dies with "dictionary
  changed size during iteration" and the broker stops routing anything. So every iteration
  walks a copy.
- It walks *every* filter for every message. ``BroadcastQueue.get()`` says which topic is about
  to be broadcast, and ``items()`` then returns only the filters that can match it: that exact
  topic and the wildcard ones (amqtt still checks each with its own matcher).
- Each connection walks every filter of every client to send it the retained messages "of its
  subscriptions" (``_handle_client_session``), and hands it those of *other* clients' filters
  too: a device connecting got every retained message the gateway's wildcard filters matched,
  other devices' topics included, past the topic ACL. ``FleetSubscriptions`` tells the table
  whose connection is next, and the table's iteration then yields that client's own filters.
- After every SUBSCRIBE it builds the table's ``repr`` for a DEBUG line, logged or not: the
  table's ``repr`` is its size.
- Removing a client's subscriptions (a clean-session CONNECT, a disconnect) walked every
  filter: the table keeps each client's filters, so it walks that client's only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

__all__ = ["BroadcastQueue", "FleetSubscriptions", "SubscriptionTable"]


class SubscriptionTable(dict[str, Any]):
    """amqtt's ``_subscriptions`` (filter -> [(session, qos)]), with the hints described above."""

    def __init__(self) -> None:
        super().__init__()
        self._wildcards: set[str] = set()
        self._of_client: dict[str, set[str]] = {}
        self.next_topic: str | None = None
        self.next_client: str | None = None

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        if "+" in key or "#" in key:
            self._wildcards.add(key)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._wildcards.discard(key)

    def clear(self) -> None:
        super().clear()
        self._wildcards.clear()
        self._of_client.clear()

    def __repr__(self) -> str:
        # amqtt logs repr(table) at DEBUG after every SUBSCRIBE, built whether logged or not:
        # every subscriber of the broker, each time
        return f"<{len(self)} subscription filters>"

    def __iter__(self) -> Iterator[str]:
        client, self.next_client = self.next_client, None
        if client is not None:  # FleetSubscriptions: the filters of the client now connecting
            return iter([key for key in self._of_client.get(client, ()) if key in self])
        return iter(list(super().__iter__()))

    def items(self) -> Any:  # a view of a copy (typeshed's dict_items is not importable)
        topic, self.next_topic = self.next_topic, None
        if topic is None:
            return dict(super().items()).items()
        candidates = (topic, *self._wildcards)
        return {key: self[key] for key in candidates if key in self}.items()

    def subscribed(self, client_id: str, key: str) -> None:
        """``client_id`` now has a subscription on filter ``key``."""
        self._of_client.setdefault(client_id, set()).add(key)

    def unsubscribed(self, client_id: str, key: str) -> None:
        """``client_id`` no longer has a subscription on filter ``key``."""
        keys = self._of_client.get(client_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._of_client[client_id]

    def filters_of(self, client_id: str) -> list[str]:
        """The filters ``client_id`` has a subscription on."""
        return list(self._of_client.get(client_id, ()))


class BroadcastQueue(asyncio.Queue[dict[str, Any]]):
    """amqtt's broadcast queue, telling the subscription table the topic it hands out next."""

    def __init__(self, table: SubscriptionTable) -> None:
        super().__init__()
        self._table = table

    async def get(self) -> dict[str, Any]:
        """The next message to broadcast; its topic goes to the table first."""
        item = await super().get()
        topic = item.get("topic")
        self._table.next_topic = topic if isinstance(topic, str) else None
        return item


class FleetSubscriptions:
    """Mixin for amqtt's ``Broker``: a ``SubscriptionTable`` kept per client as well."""

    _subscriptions: SubscriptionTable

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        table = SubscriptionTable()
        self._subscriptions = table
        self._broadcast_queue = BroadcastQueue(table)

    async def add_subscription(self, subscription: tuple[str, int], session: Any) -> int:
        """amqtt's, noting the filter as the client's when it was granted."""
        qos: int = await super().add_subscription(subscription, session)  # type: ignore[misc]
        if qos != 0x80 and subscription[0] in self._subscriptions:
            self._subscriptions.subscribed(session.client_id, subscription[0])
        return qos

    def _del_subscription(self, a_filter: str, session: Any) -> int:
        deleted: int = super()._del_subscription(a_filter, session)  # type: ignore[misc]
        if deleted:
            self._subscriptions.unsubscribed(session.client_id, a_filter)
        return deleted

    async def _del_all_subscriptions(self, session: Any) -> None:
        # amqtt's, over the client's own filters rather than every filter of the broker
        table = self._subscriptions
        for a_filter in table.filters_of(session.client_id):
            if a_filter in table and self._del_subscription(a_filter, session):
                if not table[a_filter]:
                    del table[a_filter]

    async def _publish_session_retained_messages(self, session: Any) -> None:
        await super()._publish_session_retained_messages(session)  # type: ignore[misc]
        # amqtt's next step walks the table for this client's retained messages (see above)
        self._subscriptions.next_client = session.client_id
