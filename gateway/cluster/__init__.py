"""Replicas of the gateway on an MQTT broker cluster (docs/cluster.md).

``Cluster`` is what ``app.Gateway`` composes when ``[cluster] broker`` is set: the replica's
client on the broker (client.py), the fleet records kept in step with the registry (fleet.py),
the bridge of its WebSocket devices (bridge.py) and its calls to the devices other replicas hold
(remote.py). An MQTT device's session (discovery, hello reply, keepalive) runs on the one live
replica ``owns`` picks (rendezvous hashing of its id, replica.py), announced like a WebSocket
device's; the others call it directly on the broker, and the request ids keep each replica's
replies apart. A board that serves MCP itself is held by one replica too, among those that
reach it (boards.py), and bridged as a WebSocket device.
``join()`` returns once the replica has joined: its number claimed, the fleet known.
Restarted with its data dir, it returns as soon as it is on a broker node, serving hosts from
the fleet it kept (cache.py) while the broker's records come in behind; its devices' /healthz
says 503 until it has joined. The gateway listens before it joins (docs/cluster.md, "Who may
log in"): a broker that asks the replicas about every login, their own included, must hear an
answer from a replica that has not joined yet, or no replica ever could.

Failover (docs/cluster.md): the client moves to the next broker node at once when its node
dies. A replica cut from every node for ``HANDOFF`` seconds closes its WebSocket devices (and
any that reach it meanwhile), so that they reconnect through the balancer to a replica that
can serve them; its /healthz says 503 from the first moment.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from types import TracebackType

from gateway.cluster.boards import BoardOwners
from gateway.cluster.bridge import Bridge, BridgedLink
from gateway.cluster.cache import SAVE_EVERY, FleetCache
from gateway.cluster.client import ClusterClient, broker_login
from gateway.cluster.fleet import Fleet
from gateway.cluster.live import HEARTBEAT
from gateway.cluster.records import (
    BadRecord,
    BoardOffer,
    ClusterTopics,
    Presence,
    ReplicaRecord,
    key_name,
)
from gateway.cluster.remote import RemoteCalls
from gateway.cluster.replica import (
    Ownership,
    home_node,
    id_slice,
    pick_number,
    split_slice,
)
from gateway.config import Config
from gateway.device_side.boards.link import BoardLink
from gateway.device_side.broker import Topics
from gateway.device_side.broker.aiomqtt_fixes import cancel_all
from gateway.device_side.transports.mqtt import BrokerLogin, MqttLink
from gateway.devices.link import DeviceLink
from gateway.devices.registry import DeviceRegistry
from gateway.devices.subscribers import Subscribers, Unsubscribe
from gateway.errors import ConfigError

__all__ = ["Cluster"]

logger = logging.getLogger(__name__)

_RESYNC_BEATS = round(300 / HEARTBEAT)  # heartbeats between two readings of every record
HANDOFF = 30.0  # seconds cut from every broker node before the WebSocket devices are handed off
_RECORDS_IN_FLIGHT = 256  # records published and not yet acknowledged by the broker


class Cluster:
    """This replica's part in the cluster; ``async with`` joins it."""

    def __init__(self, config: Config, registry: DeviceRegistry, replica: str) -> None:
        """``replica``: this replica's name (``replica_name``), which its audit records and
        metrics carry too."""
        assert config.cluster_broker is not None
        if config.cluster_name == config.mqtt_topic_prefix:
            raise ConfigError(
                "cluster.name", "must differ from mqtt.topic_prefix (devices' topics)"
            )
        self.topics = ClusterTopics(config.cluster_name)
        self.replica = replica
        logins = [
            broker_login(url, config.cluster_username, config.cluster_password,
                         config.cluster_ca_file)
            for url in config.cluster_broker
        ]  # fmt: skip
        # Rotated per replica: the replicas spread over the nodes rather than herd on the first.
        home = home_node(self.replica, len(logins))
        self.logins: list[BrokerLogin] = logins[home:] + logins[:home]
        self.no = 0  # claimed when joining
        self.ids = id_slice(1)
        self._registry = registry
        # A board's replies may be larger than a xiaozhi device's (a photo): its bound holds.
        frame_bytes = max(config.max_message_bytes, config.board_frame_bytes)
        self.remote = RemoteCalls(self.topics, split_slice(self.ids)[1], self._publish, frame_bytes)
        self.bridge = Bridge(self.topics, self.replica, self.ids, self._publish_retained)
        self.fleet = Fleet(
            registry, self.topics, self.replica, self.remote, self.bridge,
            device_down=Topics(config.mqtt_topic_prefix).down,
            gives_way=self._gives_way, live_changed=self._owners_changed,
        )  # fmt: skip
        self.boards = BoardOwners(self.replica)
        # Told when who owns what may have changed: MqttTransport.reown, Boards.reown
        self._mqtt_owners: Subscribers[[]] = Subscribers()
        self._board_holders: Subscribers[[]] = Subscribers()
        self.client = ClusterClient(self.logins, self.topics, self.replica, self._on_message,
                                    self._on_ready, self._lost)  # fmt: skip
        self._joined = False  # on the broker, the live replicas known
        self.ownership = Ownership()  # of MQTT devices, kept per live set
        self._devices_on_broker = config.cluster_mqtt_devices == "broker"
        self._since = 0.0  # when this replica last joined: the others tell its rejoins apart
        self._handoff: asyncio.TimerHandle | None = None  # armed while cut from the broker
        self.handed_off = False  # cut for HANDOFF: serves no WebSocket device until it rejoins
        self._tasks: list[asyncio.Task[None]] = []
        self._reread: asyncio.Task[None] | None = None
        self.cache = FleetCache(config.data_dir, self.topics.prefix)
        self.warm = False  # started from the cache: serves hosts while it catches up
        self._saved = 0  # the fleet's changes the cache holds
        self.loading = False  # reading its cache of the fleet
        self._session_ids: range | None = None  # its sessions' request ids, once claimed

    async def __aenter__(self) -> Cluster:
        return self  # joined by ``join``, once the gateway listens

    async def join(self) -> None:
        """Load what the replica kept of the fleet, go to the broker, and return once joined
        (warm: once on a broker node); /healthz says why not meanwhile."""
        self.loading = True
        try:  # 20,000 records are seconds of disk and parsing: the listeners answer meanwhile
            cached = await asyncio.to_thread(self.cache.load)
            self.warm = bool(cached)
            self.fleet.warm(cached)
        finally:
            self.loading = False
        self._saved = self.fleet.changes
        self._tasks = [
            asyncio.create_task(self.client.run(), name="gateway.cluster.client"),
            asyncio.create_task(self._pump(), name="gateway.cluster.outbox"),
            asyncio.create_task(self._heartbeat(), name="gateway.cluster.heartbeat"),
            asyncio.create_task(self._keep(), name="gateway.cluster.cache"),
        ]
        logger.info("replica %s joining the cluster %r at %s%s", self.replica,
                    self.topics.prefix, self.client.where,
                    " (serving from its cache meanwhile)" if self.warm else "")  # fmt: skip
        # Warm: serve once on a node, the records coming in behind (the broker's win once
        # heard); it owns no MQTT device and calls no other replica's until it has joined.
        await (self.client.on_node if self.warm else self.client.connected).wait()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._handoff is not None:
            self._handoff.cancel()
        if self.client.connected.is_set():  # leave cleanly: the others need no will to know
            await self.client.publish(self.topics.replica(self.replica), b"", retain=True)
            await self.client.publish(self.topics.boards(self.replica), b"", retain=True)
        await cancel_all([*self._tasks, *([self._reread] if self._reread else [])])
        if self.fleet.changes != self._saved:
            await self.cache.save(self.fleet.records)

    # --- what the gateway asks -------------------------------------------------------------

    @property
    def login(self) -> BrokerLogin:
        """The broker node this replica is on, or tries next."""
        return self.client.login

    def health(self) -> str | None:
        """None while the replica serves hosts (joined, or on the broker and catching up from
        its cache), else why it is not healthy."""
        if self.warm and self.client.on_node.is_set():
            return None
        return self.device_health()

    def device_health(self) -> str | None:
        """None while the replica has joined, else why devices should go elsewhere."""
        if self.client.connected.is_set():
            return None
        if self.loading:
            return f"replica {self.replica} is loading its copy of the fleet"
        where = self.client.where
        if self.no == 0 and not self.client.on_node.is_set():  # never joined yet
            return f"replica {self.replica} is joining the cluster (no broker node yet, at {where})"
        if self.client.on_node.is_set():
            return f"replica {self.replica} is joining the cluster at {where}"
        return f"replica {self.replica} is cut from the cluster broker at {where}"

    def knows_fleet(self) -> bool:
        """Has this replica joined (the fleet read, the live replicas known)? Only then does
        it decide a device's broker login (broker_auth.py)."""
        return self.device_health() is None

    def session_ids(self) -> range | None:
        """The request ids of this replica's sessions with devices: None until it has claimed
        its number (a session opened meanwhile numbers its requests from 1, as a single
        gateway's; ``Bridge.ours`` takes their replies)."""
        return self._session_ids

    def subscribe_mqtt_owners(self, reown: Callable[[], None]) -> Unsubscribe:
        """Call ``reown`` whenever which replica owns which MQTT device may have changed."""
        return self._mqtt_owners.subscribe(reown)

    def subscribe_board_holders(self, reown: Callable[[], None]) -> Unsubscribe:
        """Call ``reown`` whenever which replica holds which board may have changed."""
        return self._board_holders.subscribe(reown)

    def owns(self, device_id: str) -> bool:
        """Does this replica run the MQTT device's session? The live replica it hashes to;
        none while it is cut from the broker or rejoining (it would not know who lives)."""
        if not self._joined:
            return False
        live = frozenset((*self.fleet.live, self.replica))
        return self.ownership.owner(device_id, live) == self.replica

    def owns_board(self, device_id: str) -> bool:
        """Does this replica hold the board (it reaches it, and wins among the live replicas
        that do)? Not while it is cut from the broker or rejoining, as for MQTT devices."""
        if not self._joined:
            return False
        live = (*self.fleet.live, self.replica)
        return self.boards.holder(device_id, live) == self.replica

    def offer_boards(self, device_ids: frozenset[str]) -> None:
        """This replica reaches these boards now (its config, data dir and mDNS view)."""
        if device_ids == self.boards.mine:
            return
        self.boards.mine = device_ids
        self._offer()
        self._boards_moved()

    def _offer(self) -> None:
        """Say on the broker which boards this replica reaches (nothing: no record)."""
        mine = self.boards.mine
        record = BoardOffer(mine, time.time()).encode() if mine else b""
        self.fleet.outbox.put_nowait((self.topics.boards(self.replica), record, True))

    def _on_offer(self, name: str, payload: bytes) -> None:
        if self.boards.hear(name, BoardOffer.read(payload) if payload else None):
            self._boards_moved()

    def _owners_changed(self) -> None:
        """The live replicas changed: who owns which MQTT device and holds which board."""
        self._mqtt_owners.notify()
        self._boards_moved()

    def _boards_moved(self) -> None:
        self._board_holders.notify()  # connects the boards it holds now, lets the others go
        for device_id, link in self.bridge.held_links().items():
            if link.board and not self.owns_board(device_id):
                self.fleet.local_ended(device_id)  # its holder's session, if announced, wins

    def _gives_way(self, device_id: str, presence: Presence) -> bool:
        """Does the device's session here give way to the one ``presence`` names? Only one
        placed by an ownership rule, once this replica no longer owns it: a board's, an MQTT
        device's on the cluster broker (to an MQTT presence). A WebSocket device connected
        here keeps its link (it chose this replica)."""
        if self.bridge.board(device_id):
            return not self.owns_board(device_id)
        if presence.mqtt and self.bridge.direct(device_id):
            return not self.owns(device_id)
        return False

    def bridged(
        self, link: DeviceLink, device_id: str, session: str
    ) -> tuple[DeviceLink, Callable[[], None]]:
        """Bridge a local device onto the broker for the other replicas (an MQTT device this
        replica owns: announced only); the link to serve, and what to call when it ends."""
        # An MQTT device on the cluster broker is called there; one on this replica's own
        # broker ([cluster] mqtt_devices = "replica") only through this replica, as a WebSocket
        # device.
        direct = isinstance(link, MqttLink) and self._devices_on_broker
        board = isinstance(link, BoardLink)  # held where boards.py says, else handed over
        bridged = self.bridge.wrap(link, device_id, session, direct=direct, board=board)
        if self.handed_off and not isinstance(link, MqttLink):  # elsewhere, through the balancer
            self.bridge.hand_off([device_id])
        return bridged, lambda: self._ended(bridged)

    def _ended(self, link: BridgedLink) -> None:
        self.bridge.release(link, clear=self.fleet.announced_here(link.device_id))
        self.fleet.local_ended(link.device_id)

    # --- the broker ------------------------------------------------------------------------

    def _on_message(self, topic: str, payload: bytes) -> None:
        parsed = self.topics.parse(topic)
        if parsed is None:
            return
        kind, key, direction = parsed
        if kind == "boards":
            try:
                self._on_offer(key, payload)
            except BadRecord as exc:
                logger.warning("cluster: boards record %s refused: %s", key[:80], exc)
        elif kind != "bridge":
            self.fleet.on_record(kind, key, payload)
        elif direction == "up":
            self.remote.on_reply(key, payload.decode(errors="replace"))
        else:
            self.bridge.down(key, payload)

    async def _on_ready(self) -> None:
        """Joined (again): claim a number the first time, say we live, reconcile the fleet."""
        self._since = time.time()
        if self.no == 0:
            await self._claim()
        else:
            await self._say_alive()
        self._offer()  # what it reaches, again: the broker may have lost it meanwhile
        self.fleet.rejoined()
        self._joined, self.warm = True, False  # caught up: healthy as any joined replica
        if not self.fleet.calls_ready:
            self.fleet.numbered()
        if self._handoff is not None:
            self._handoff.cancel()
        self._handoff, self.handed_off = None, False
        self.fleet.live_changed()  # the MQTT devices this replica owns now

    def _lost(self) -> None:
        self._joined = False
        self.fleet.lost()
        if self._handoff is None:
            self._handoff = asyncio.get_running_loop().call_later(HANDOFF, self._hand_off)

    def _hand_off(self) -> None:
        self.handed_off = True
        # WebSocket devices only: closing its session would not move an MQTT device, which
        # stays logged in to its broker.
        links = self.bridge.held_links().items()
        held = [d for d, link in links if not isinstance(link.inner, MqttLink)]
        logger.warning("replica %s cut from every cluster broker node for %g s: closing its %d "
                       "WebSocket devices, to reconnect to a replica that can serve them",
                       self.replica, HANDOFF, len(held))  # fmt: skip
        self.bridge.hand_off(held)

    async def _claim(self) -> None:
        for _ in range(3):
            taken = {r.no for name, r in self.fleet.live.items() if name != self.replica}
            self._take(pick_number(self.replica, taken))
            await self._say_alive()
            await self.client.sync()
            rivals = [n for n, r in self.fleet.live.items() if r.no == self.no and n < self.replica]
            if not rivals:
                break
            logger.info("replica number %d is %s's too; taking another", self.no, rivals[0])
        logger.info("replica %s is number %d (request ids %d..%d)", self.replica, self.no,
                    self.ids[0], self.ids[-1])  # fmt: skip

    def _take(self, no: int) -> None:
        self.no, self.ids = no, id_slice(no)
        sessions, calls = split_slice(self.ids)
        self.remote.use_ids(calls)
        self.bridge.own_ids = self.ids
        self._session_ids = sessions

    async def _keep(self) -> None:
        """Save the fleet's records to the cache while they change: every ``SAVE_EVERY``
        seconds, or 20 times as long as the last save took (a large fleet in a storm of
        changes spends at most a twentieth of its time on it)."""
        loop, took = asyncio.get_running_loop(), 0.0
        while True:
            await asyncio.sleep(max(SAVE_EVERY, 20 * took))
            if self.fleet.changes != self._saved:
                self._saved, began = self.fleet.changes, loop.time()
                await self.cache.save(self.fleet.records)
                took = loop.time() - began

    async def _say_alive(self) -> None:
        record = ReplicaRecord(
            self.no, time.time(), self._since, key=key_name(self._registry.binding_key)
        )
        await self.client.publish(self.topics.replica(self.replica), record.encode(), retain=True)

    async def _heartbeat(self) -> None:
        beats = 0
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + HEARTBEAT
            await asyncio.sleep(HEARTBEAT)
            if self.client.connected.is_set():
                if loop.time() - due < HEARTBEAT:  # not after a stall: what we heard is recent
                    self.fleet.fail_silent()
                await self._say_alive()
                for name in self.fleet.expire():
                    await self.client.publish(self.topics.replica(name), b"", retain=True)
                beats += 1
                if beats % _RESYNC_BEATS == 0:  # records the broker may have dropped or lost
                    self._reread = asyncio.create_task(self._read_again())

    async def _read_again(self) -> None:
        """Read every retained record again; publish again what the broker lost (a task of
        its own: losing the broker meanwhile cancels its barrier, not the heartbeat)."""
        self.fleet.reading()
        if await self.client.resubscribe():
            await self.client.sync()
            self.fleet.repair()
            self._offer()  # likewise

    async def _pump(self) -> None:
        """Publish the fleet's records in order, many at once: a join storm is thousands of
        records, and one broker round trip each, in turn, would take minutes. A record lost
        while cut off is published again by ``rejoined`` (the broker never echoed it)."""
        slots = asyncio.Semaphore(_RECORDS_IN_FLIGHT)
        sending: set[asyncio.Task[None]] = set()

        async def send(topic: str, payload: bytes, retain: bool) -> None:
            try:
                await self.client.publish(topic, payload, retain=retain)
            finally:
                slots.release()

        try:
            while True:
                topic, payload, retain = await self.fleet.outbox.get()
                await slots.acquire()
                # Tasks start in creation order, so the client sends the records in order.
                task = asyncio.create_task(send(topic, payload, retain))
                sending.add(task)
                task.add_done_callback(sending.discard)
        finally:
            for task in sending:
                task.cancel()

    async def _publish(self, topic: str, payload: bytes) -> bool:
        return await self.client.publish(topic, payload, retain=False)

    async def _publish_retained(self, topic: str, payload: bytes, retain: bool) -> bool:
        return await self.client.publish(topic, payload, retain=retain)
