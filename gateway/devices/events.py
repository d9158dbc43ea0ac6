"""What devices report on their own: each device's recent events and its latest per logger.

A device's MCP logging notification (``notifications/message``; the core's ``DeviceLogged``)
is an event of that device (docs/events.md). The store keeps, per device, the last ``keep``
events younger than ``max_age`` (newest first) and the latest event of each logger (its
*state*), and hands every event kept to whoever watches (``watch()``: resource notifications,
``wait_for_event``, channels, the dashboard).

Bad input is bounded here: an event of a device that is not approved (pending, rejected,
unknown) is dropped and counted (``dropped``); a device past its rate (a token bucket:
``burst`` events, then ``per_second``) has its events *coalesced*: the latest one waits and goes
out when the bucket allows, saying how many it stands for (``coalesced``), so a flood costs one
waiting event and one timer per device, and harms no other. Its state still follows every event.

Events and state are kept in the data dir (``events/``, private, one JSON file per device),
written behind: at most once per ``SAVE_DELAY`` per device, off the event loop; ``aclose()``
writes what is left. They are read back at start, so a restart loses none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.datadir import KeptJson, private_dir
from gateway.devices.known import DeviceView
from gateway.errors import StorageUnavailable
from gateway.protocol import DeviceLogged

__all__ = ["DeviceEvent", "EventFeed", "EventStore", "approved_in", "events_uri", "state_uri"]

logger = logging.getLogger(__name__)

SAVE_DELAY = 1.0  # seconds between two writes of one device's events
MAX_LOGGERS = 32  # loggers whose latest event a device keeps (its state)
FEED_BACKLOG = 256  # events one watcher may fall behind before the oldest are dropped
EVENTS_URI_PREFIX = "device://"


def events_uri(alias: str) -> str:
    """The MCP resource URI of a device's recent events."""
    return f"{EVENTS_URI_PREFIX}{alias}/events"


def state_uri(alias: str) -> str:
    """The MCP resource URI of a device's latest event per logger."""
    return f"{EVENTS_URI_PREFIX}{alias}/state"


def approved_in(registry: DeviceView) -> Callable[[str], bool]:
    """Whether a device of ``registry`` is approved: the store's ``approved``."""

    def approved(device_id: str) -> bool:
        device = registry.get(device_id)
        return device is not None and device.approved

    return approved


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """One event a device reported."""

    device_id: str
    seq: int  # the store's count of events kept when it was kept: orders them all
    at: float  # epoch seconds
    level: str
    logger: str
    data: object
    cut: bool = False  # ``data`` was cut to its bound
    coalesced: int = 0  # events it stands for beyond itself (a flood folded in)

    def as_json(self) -> dict[str, Any]:
        """What resources, the JSON API and the store's files hold."""
        fields: dict[str, Any] = {
            "device": self.device_id,
            "seq": self.seq,
            "at": self.at,
            "level": self.level,
            "logger": self.logger,
            "data": self.data,
        }
        if self.cut:
            fields["cut"] = True
        if self.coalesced:
            fields["coalesced"] = self.coalesced
        return fields

    def shown(self, alias: str) -> dict[str, Any]:
        """As hosts and people see it: ``device`` is the device's name, ``id`` its id."""
        return {**self.as_json(), "device": alias, "id": self.device_id}

    @classmethod
    def from_json(cls, fields: dict[str, Any]) -> DeviceEvent:
        """The event ``as_json`` wrote.

        Raises:
            KeyError, TypeError, ValueError: it is not such a record.
        """
        return cls(
            str(fields["device"]),
            int(fields["seq"]),
            float(fields["at"]),
            str(fields["level"]),
            str(fields["logger"]),
            fields.get("data"),
            bool(fields.get("cut", False)),
            int(fields.get("coalesced", 0)),
        )


class EventFeed:
    """The events kept since it was opened (``EventStore.watch()``), each once, in order.

    A watcher that falls ``FEED_BACKLOG`` events behind loses the oldest: a slow host never
    holds memory without bound.
    """

    __slots__ = ("_backlog", "_ready")

    def __init__(self) -> None:
        self._backlog: deque[DeviceEvent] = deque(maxlen=FEED_BACKLOG)
        self._ready = asyncio.Event()

    def put(self, event: DeviceEvent) -> None:
        """Hand ``event`` to the watcher."""
        self._backlog.append(event)
        self._ready.set()

    def __aiter__(self) -> EventFeed:
        return self

    async def __anext__(self) -> DeviceEvent:
        while not self._backlog:
            self._ready.clear()
            await self._ready.wait()
        return self._backlog.popleft()


@dataclass(slots=True)
class _Bucket:
    """One device's rate: tokens left, when counted, and the event waiting for a token."""

    tokens: float
    counted: float
    waiting: DeviceEvent | None = None
    folded: int = 0  # events the waiting one stands for beyond itself
    timer: asyncio.TimerHandle | None = None


class EventStore:
    """Every device's recent events and state, under ``directory`` (None: in memory only)."""

    def __init__(
        self,
        directory: Path | None,
        approved: Callable[[str], bool],
        *,
        keep: int = 100,
        max_age: float = 7 * 86400.0,
        per_second: float = 2.0,
        burst: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``approved(device_id)`` says whether a device's events may be kept (approved devices
        only); ``clock`` paces the rate (the running loop's, for its timers)."""
        self._directory = directory
        self._approved = approved
        self._keep, self._max_age = keep, max_age
        self._per_second, self._burst = per_second, burst
        self._clock = clock
        self._recent: dict[str, deque[DeviceEvent]] = {}
        self._state: dict[str, dict[str, DeviceEvent]] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._feeds: set[EventFeed] = set()
        self._feeds_changed = asyncio.Event()
        self._unsaved: set[str] = set()
        self._saver: asyncio.TimerHandle | None = None
        self._saving: asyncio.Task[None] | None = None
        self.seq = 0
        self.dropped = 0  # events of devices not approved, dropped
        self.coalesced = 0  # events folded into a later one by the rate limit
        if directory is not None:
            private_dir(directory)
            self._load(directory)

    # --- reading -----------------------------------------------------------------------------

    def recent(self, device_id: str) -> list[DeviceEvent]:
        """The device's events kept, newest first (none older than ``max_age``)."""
        kept = self._recent.get(device_id)
        if not kept:
            return []
        oldest = time.time() - self._max_age
        return [event for event in reversed(kept) if event.at >= oldest]

    def state(self, device_id: str) -> dict[str, DeviceEvent]:
        """The device's latest event per logger, by logger name."""
        return dict(sorted(self._state.get(device_id, {}).items()))

    def retained(self) -> int:
        """How many events the store holds in memory now (recent, state, waiting)."""
        waiting = sum(bucket.waiting is not None for bucket in self._buckets.values())
        return sum(map(len, self._recent.values())) + sum(map(len, self._state.values())) + waiting

    async def wait_watching(self, count: int) -> None:
        """Wait until ``count`` feeds are open."""
        while len(self._feeds) != count:
            await self._feeds_changed.wait()

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[EventFeed]:
        """``async with store.watch() as feed: async for event in feed``: every event kept
        from now on."""
        feed = EventFeed()
        self._feeds.add(feed)
        self._signal()
        try:
            yield feed
        finally:
            self._feeds.discard(feed)
            self._signal()

    def _signal(self) -> None:
        self._feeds_changed.set()
        self._feeds_changed = asyncio.Event()

    # --- events arriving ---------------------------------------------------------------------

    def add(self, device_id: str, logged: DeviceLogged) -> DeviceEvent | None:
        """Take an event the device reported; return it if it was kept now (not dropped or
        waiting for the device's rate)."""
        if not self._approved(device_id):
            self.dropped += 1
            return None
        event = DeviceEvent(
            device_id, 0, time.time(), logged.level, logged.logger, logged.data, logged.cut
        )
        states = self._state.setdefault(device_id, {})
        if logged.logger not in states and len(states) >= MAX_LOGGERS:
            del states[min(states, key=lambda name: states[name].at)]  # the stalest logger goes
        states[logged.logger] = event  # the state follows every event, kept or waiting
        bucket = self._bucket(device_id)
        if bucket.tokens < 1:
            self._fold(device_id, bucket, event)
            return None
        bucket.tokens -= 1
        return self._keep_event(event, bucket)

    def forget(self, device_id: str) -> None:
        """Drop the device's events (the device was forgotten); its file goes too."""
        self._recent.pop(device_id, None)
        self._state.pop(device_id, None)
        bucket = self._buckets.pop(device_id, None)
        if bucket is not None and bucket.timer is not None:
            bucket.timer.cancel()
        self._unsaved.discard(device_id)
        if self._directory is not None:
            with contextlib.suppress(OSError):
                self._path(device_id).unlink()

    async def aclose(self) -> None:
        """Write what is not written yet (the gateway stops)."""
        for bucket in self._buckets.values():
            if bucket.timer is not None:
                bucket.timer.cancel()
        if self._saver is not None:
            self._saver.cancel()
        if self._saving is not None:
            await self._saving
        await self._save()

    def _bucket(self, device_id: str) -> _Bucket:
        now = self._clock()
        bucket = self._buckets.get(device_id)
        if bucket is None:
            bucket = self._buckets[device_id] = _Bucket(float(self._burst), now)
        else:
            bucket.tokens = min(
                float(self._burst), bucket.tokens + (now - bucket.counted) * self._per_second
            )
            bucket.counted = now
        return bucket

    def _fold(self, device_id: str, bucket: _Bucket, event: DeviceEvent) -> None:
        """Past its rate: ``event`` waits in place of the one that waited (which it stands for
        now), until a token comes."""
        if bucket.waiting is not None:
            bucket.folded += 1
            self.coalesced += 1
        bucket.waiting = event
        if bucket.timer is None:
            delay = (1 - bucket.tokens) / self._per_second
            bucket.timer = asyncio.get_running_loop().call_later(delay, self._release, device_id)

    def _release(self, device_id: str) -> None:
        """A token came for the event that waited: keep it."""
        bucket = self._buckets.get(device_id)
        if bucket is None or bucket.waiting is None:
            return
        bucket.timer = None
        self._bucket(device_id)
        bucket.tokens = max(0.0, bucket.tokens - 1)
        event, bucket.waiting = bucket.waiting, None
        folded, bucket.folded = bucket.folded, 0
        self._keep_event(event, bucket, folded)

    def _keep_event(self, event: DeviceEvent, bucket: _Bucket, folded: int = 0) -> DeviceEvent:
        self.seq += 1
        kept = DeviceEvent(
            event.device_id,
            self.seq,
            event.at,
            event.level,
            event.logger,
            event.data,
            event.cut,
            folded,
        )
        recent = self._recent.get(event.device_id)
        if recent is None:
            recent = self._recent[event.device_id] = deque(maxlen=self._keep)
        recent.append(kept)
        states = self._state[event.device_id]
        if states.get(event.logger) is event:  # the state names the kept event, with its seq
            states[event.logger] = kept
        for feed in self._feeds:
            feed.put(kept)
        self._unsaved.add(event.device_id)
        if self._directory is not None and self._saver is None and self._saving is None:
            self._saver = asyncio.get_running_loop().call_later(SAVE_DELAY, self._save_soon)
        return kept

    # --- the data dir ------------------------------------------------------------------------

    def _save_soon(self) -> None:
        self._saver = None
        self._saving = asyncio.create_task(self._save(), name="gateway.events.save")

    async def _save(self) -> None:
        try:
            while self._unsaved and self._directory is not None:
                devices, self._unsaved = self._unsaved, set()
                documents = {device_id: self._document(device_id) for device_id in devices}
                await asyncio.to_thread(self._write, documents)
        finally:
            self._saving = None

    def _document(self, device_id: str) -> dict[str, Any]:
        return {
            "events": [event.as_json() for event in self._recent.get(device_id, ())],
            "state": [event.as_json() for event in self._state.get(device_id, {}).values()],
        }

    def _write(self, documents: dict[str, dict[str, Any]]) -> None:
        for device_id, document in documents.items():
            try:
                KeptJson(self._path(device_id), dict, f"the events of {device_id}").save(document)
            except (OSError, StorageUnavailable) as exc:
                logger.warning("events of %s kept in memory only: %s", device_id, exc)

    def _path(self, device_id: str) -> Path:
        assert self._directory is not None
        return self._directory / (urllib.parse.quote(device_id, safe="") + ".json")

    def _load(self, directory: Path) -> None:
        oldest = time.time() - self._max_age
        for path in sorted(directory.glob("*.json")):
            document = KeptJson(path, dict, "a device's events").load()
            try:
                events = [DeviceEvent.from_json(fields) for fields in document.get("events", [])]
                state = [DeviceEvent.from_json(fields) for fields in document.get("state", [])]
            except (KeyError, TypeError, ValueError, AttributeError):
                logger.warning("events file %s cannot be read; skipped", path.name)
                continue
            events = [event for event in events if event.at >= oldest][-self._keep :]
            if events:
                device_id = events[0].device_id
                self._recent[device_id] = deque(events, maxlen=self._keep)
                self.seq = max(self.seq, events[-1].seq)
            for event in state[-MAX_LOGGERS:]:
                self._state.setdefault(event.device_id, {})[event.logger] = event
