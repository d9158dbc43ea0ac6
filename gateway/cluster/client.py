"""The replica's own MQTT client on the cluster broker: records in, records out, a last will.

One aiomqtt client per replica, apart from the device transport's: it carries the last will
that tells the others this replica is gone (an empty retained ``P/replica/<name>``), and a
barrier (``sync``): after subscribing, a message published to the replica's own sync topic
comes back only after every retained record the broker sent for the subscriptions, so "the
whole fleet is known" is an event, not a guess. Losing the broker is told at once
(``on_lost``); the client reconnects to the next node of the broker cluster at once (``[cluster]
broker`` lists them), and waits with backoff (0.5 s doubling, at most 5 s) only once every node
failed in a row (failover.py). A node that refuses a subscription (a NATS node while JetStream
elects a leader) is asked again for ``_SUBSCRIBE_PATIENCE``, then left for the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import aiomqtt

from gateway.cluster.records import ClusterTopics
from gateway.compat.aiomqtt import consume_disconnect, mend_socket_registration
from gateway.device_side.broker.aiomqtt_fixes import (
    honour_cancellation,
    publish_honouring_cancellation,
    refused,
    subscribe_all,
)
from gateway.device_side.transports.mqtt import BrokerLogin
from gateway.device_side.transports.mqtt.failover import Failover

__all__ = ["BrokerUnfit", "ClusterClient", "broker_login"]

logger = logging.getLogger(__name__)

# seconds: the broker fires our will within 1.5 of these after a silent death, and we leave a
# node that went silent within 1.5 of them
_KEEPALIVE = 5
_RETRY = (0.5, 5.0)
_SUBSCRIBE_PATIENCE = 30.0
_TURN = 64  # records handled before the loop's other tasks get a turn
_SYNC_AGAIN = 5.0  # seconds: far above a loaded broker's echo, far below a host's patience
# Connections in a row to one node whose retained probe did not come back while live messages
# did, before the node is judged unfit: one miss is what a NATS node electing leaders does (it
# acknowledges the probe and stores it late), a broker without the feature misses every time.
_PROBE_PROOF = 2
# The QoS of what the broker delivers to a replica. 0: its sessions are clean, so a lost
# connection loses what was in flight whatever the QoS, and the replica heals that itself (it
# resubscribes and syncs at every join); what QoS 1 would add is a broker-side consumer per
# subscription. On NATS that is a JetStream consumer, and after a node dies creating each one
# takes seconds for minutes (measured: 8 subscriptions 17-40 s at QoS 1, at once at QoS 0).
# Publishes stay QoS 1: the broker acknowledges each record it keeps.
_DELIVERY_QOS = 0
# A replica that failed over asks its first node every HOME_EVERY seconds whether it answers
# (a login and a granted subscription, within _HOME_PATIENCE), and returns once it has for
# HOME_HOLD seconds in a row: the replicas spread again, and a node that flaps is not chased.
HOME_EVERY = 5.0
HOME_HOLD = 30.0
_HOME_PATIENCE = 5.0
_OVERLAP_KEPT = 100_000  # live messages remembered while on two nodes (a few seconds of calls)


def broker_login(
    url: str, username: str | None, password: str | None, ca_file: Path | None
) -> BrokerLogin:
    """The login for ``[cluster] broker`` (``mqtt://host:port`` or ``mqtts://host:port``)."""
    parts = urllib.parse.urlsplit(url)
    tls = parts.scheme == "mqtts"
    port = parts.port or (8883 if tls else 1883)
    return BrokerLogin(parts.hostname or "", port, username, password, tls=tls, ca_file=ca_file)


class BrokerUnfit(Exception):
    """The broker lacks what the cluster needs of it (docs/cluster.md, which brokers qualify)."""


class ClusterClient:
    """Connects, subscribes, dispatches; ``publish`` queues in order while connected."""

    def __init__(
        self,
        logins: Sequence[BrokerLogin],
        topics: ClusterTopics,
        replica: str,
        on_message: Callable[[str, bytes], None],
        on_ready: Callable[[], Awaitable[None]],
        on_lost: Callable[[], None],
    ) -> None:
        self.nodes = Failover(logins, _RETRY)
        self.topics = topics
        self.replica = replica
        self.connected = asyncio.Event()  # joined: the barrier passed, ``on_ready`` done
        self.on_node = asyncio.Event()  # logged in to a node: its records come next
        self._on_message = on_message
        self._on_ready = on_ready
        self._on_lost = on_lost
        self._client: aiomqtt.Client | None = None
        self._sync: dict[str, asyncio.Future[None]] = {}
        self._probe_misses: dict[str, int] = {}  # node -> retained probes missed in a row
        self._failure = ""  # the last failure logged (once per node and reason)
        # While moving back to the first node, on two connections: each live message handled,
        # and the connection it came on; a sync token to the node left, echoed there
        self._overlap: dict[tuple[str, bytes], aiomqtt.Client] | None = None
        self._drain: dict[str, asyncio.Future[None]] = {}
        self._leaving: set[asyncio.Task[None]] = set()  # a connection made for a move undone
        # Set with an MqttError when the node refuses a subscription asked again (``resubscribe``)
        self._refused: asyncio.Future[None] | None = None

    @property
    def login(self) -> BrokerLogin:
        """The node connected to, or tried next."""
        return self.nodes.current

    @property
    def where(self) -> str:
        return self.nodes.where

    async def run(self) -> None:
        """Stay connected (forever; cancel to stop)."""
        moved: tuple[aiomqtt.Client, asyncio.Task[None]] | None = None  # back on the first node
        while True:
            client, reader = moved if moved is not None else (self._client_for(), None)
            moved = None
            where = self.where
            try:
                async with contextlib.AsyncExitStack() as stack:
                    if reader is None:
                        await stack.enter_async_context(client)
                        # (told before subscribing: a broker sends a subscription's retained
                        # records before it acknowledges the next, 20,000 records are seconds)
                        self.on_node.set()
                        honour_cancellation()
                        await subscribe_all(client, self._subscriptions(), _SUBSCRIBE_PATIENCE)
                        honour_cancellation()
                        self._client = client
                        reader = self._reader(client)
                    else:  # connected, subscribed and serving since the move (``_go_home``)
                        stack.push_async_callback(_leave, client)
                    moved = await self._serve(reader)
            except aiomqtt.MqttError as exc:
                if f"{where}: {exc}" != self._failure:  # once per node and reason, not every retry
                    self._failure = f"{where}: {exc}"
                    then = "retrying" if len(self.nodes.logins) == 1 else "trying the next node"
                    logger.warning("cluster broker at %s: %s; %s", where, exc or "lost", then)
            except BrokerUnfit as exc:
                if str(exc) != self._failure:
                    self._failure = str(exc)
                    logger.error("%s", self._failure)
            except Exception:  # a bug in joining must not end the link silently: the replica
                # would wait to join for ever (its start awaits ``connected``), saying nothing
                logger.exception("replica %s: joining the cluster at %s failed; retrying",
                                 self.replica, where)  # fmt: skip
            finally:
                self._overlap = None  # the node left is closed: nothing more comes twice
                # A connection the node dropped outside message iteration (in a subscribe, or
                # the one left behind by a move) keeps its error unretrieved: asyncio would
                # log it when collected, as a failure of nothing in particular.
                consume_disconnect(client)
                if moved is None:
                    self._lost()
            if moved is None:
                honour_cancellation()
                await asyncio.sleep(self.nodes.failed())

    async def _serve(
        self, reader: asyncio.Task[None]
    ) -> tuple[aiomqtt.Client, asyncio.Task[None]] | None:
        """Join (unless joined already), then read until the connection ends (raises) or the
        replica moved back to its first node: the new connection and its reader then."""
        moved = None
        ready = None if self.connected.is_set() else asyncio.create_task(self._ready())
        homing = asyncio.create_task(self._go_home(), name="gateway.cluster.home")
        dropped = self._refused = asyncio.get_running_loop().create_future()
        try:
            if ready is not None:
                await asyncio.wait((reader, ready), return_when=asyncio.FIRST_COMPLETED)
                if ready.done():
                    ready.result()
                    self._failure = ""
                    self.nodes.ready()
                    self.connected.set()
            await asyncio.wait((reader, homing, dropped), return_when=asyncio.FIRST_COMPLETED)
            if dropped.done():
                dropped.result()  # raises: the next node
            if homing.done():
                moved = homing.result()
                return moved  # ``run`` closes the node left; the replica stays joined
            await reader
            return None
        finally:
            reader.cancel()
            homing.cancel()
            if ready is not None:
                ready.cancel()
            if moved is None:  # now, not after aiomqtt's goodbye, which may wait out its timeout
                self._lost()

    def _reader(self, client: aiomqtt.Client) -> asyncio.Task[None]:
        return asyncio.create_task(self._read(client), name="gateway.cluster.read")

    def _subscriptions(self) -> list[tuple[str, int]]:
        return [(topic, _DELIVERY_QOS) for topic in self.topics.subscriptions(self.replica)]

    async def _go_home(self) -> tuple[aiomqtt.Client, asyncio.Task[None]]:
        """Away from the first node of its list (it failed over): return there once it has
        answered for ``HOME_HOLD`` seconds in a row (a node that flaps is not chased), make
        before break: connected and subscribed there, the replica serving on both a moment,
        then on the first node only (the caller closes the other). Never returns at home."""
        if not self.nodes.away:
            await asyncio.Future()  # the first node: stay until it fails
        await self.connected.wait()
        home, loop = self.nodes.logins[0], asyncio.get_running_loop()
        where = f"{home.host}:{home.port}"
        healthy_since: float | None = None
        while True:
            await asyncio.sleep(HOME_EVERY)
            if not await self._answers(home):
                healthy_since = None
                continue
            if healthy_since is None:
                healthy_since = loop.time()
                logger.info("replica %s: its first node %s answers again; returning after %g s "
                            "more of that", self.replica, where, HOME_HOLD)  # fmt: skip
            if loop.time() - healthy_since < HOME_HOLD:
                continue
            moved = await self._prepare(home)
            if moved is not None:
                logger.info("replica %s moved back to its first node %s", self.replica, where)
                return moved
            healthy_since = None

    async def _answers(self, login: BrokerLogin) -> bool:
        """Does the node take a login (ours) and grant a subscription now? A connection of its
        own, bounded, gone at once: no will, no records."""
        # aiomqtt's own timeouts bound it (connect, SUBACK): one of ours cancelling its
        # connect would leave a callback failing in the loop when the socket closes
        probe = mend_socket_registration(aiomqtt.Client(
            login.host, login.port, username=login.username, password=login.password,
            identifier=f"esp-mcp-replica-{self.replica}-probe-{secrets.token_hex(3)}",
            clean_session=True, timeout=_HOME_PATIENCE, tls_context=login.ssl_context(),
        ))  # fmt: skip
        try:
            async with probe:
                granted = await probe.subscribe(self.topics.sync(self.replica), qos=_DELIVERY_QOS)
        except (aiomqtt.MqttError, OSError):
            return False
        finally:
            consume_disconnect(probe)
        return not refused(granted)

    async def _prepare(
        self, login: BrokerLogin
    ) -> tuple[aiomqtt.Client, asyncio.Task[None]] | None:
        """Connect and subscribe on ``login`` while the current connection serves; then publish
        there, and drain the current connection (its last messages read, its publishes
        acknowledged). Every message that comes on both meanwhile is handled once. None (the
        current connection untouched) if the node does not take it within ``_HOME_PATIENCE``."""
        old, client = self._client, self._client_for(login)
        if old is None:
            return None
        self._overlap = {}
        try:  # bounded by aiomqtt's timeout (connect, each SUBACK) and the patience
            await client.__aenter__()
            await subscribe_all(client, self._subscriptions(), _HOME_PATIENCE)
        except aiomqtt.MqttError as exc:
            self._overlap = None
            await _leave(client)
            logger.info("replica %s: not back on %s:%s yet: %s", self.replica, login.host,
                        login.port, exc or "no answer")  # fmt: skip
            return None
        reader = self._reader(client)
        self._client = client  # publishes go there from now on
        self.nodes.home()
        # What the node left still sends or acknowledges comes before this echo of its own.
        token = secrets.token_hex(8)
        drained = self._drain[token] = asyncio.get_running_loop().create_future()
        try:
            await publish_honouring_cancellation(
                old, self.topics.sync(self.replica), token.encode(), qos=1, retain=False
            )
            async with asyncio.timeout(_SYNC_AGAIN):
                await drained
        except (aiomqtt.MqttError, TimeoutError):
            pass  # the node left is going anyway: what it still held, its senders resend
        except asyncio.CancelledError:  # the node left died meanwhile: ``run`` starts over
            reader.cancel()
            leaving = asyncio.create_task(_leave(client))
            self._leaving.add(leaving)
            leaving.add_done_callback(self._leaving.discard)
            raise
        finally:
            self._drain.pop(token, None)
        return client, reader

    def _lost(self) -> None:
        """The broker is gone (idempotent): say so once."""
        was = self._client is not None
        self._client = None
        self.connected.clear()
        self.on_node.clear()
        for future in self._sync.values():
            future.cancel()
        self._sync.clear()
        if was:
            self._on_lost()

    async def _ready(self) -> None:
        await self._check_retained_to_wildcards()
        await self.sync()
        await self._on_ready()
        logger.info("replica %s joined the cluster at %s", self.replica, self.where)

    async def _read(self, client: aiomqtt.Client) -> None:
        read = 0
        async for message in client.messages:
            read += 1
            if read % _TURN == 0:  # a queue of 20,000 records is drained without a pause:
                await asyncio.sleep(0)  # hosts' requests (a warm replica serves) take turns
            payload = message.payload
            data = bytes(payload) if isinstance(payload, bytes | bytearray) else b""
            topic = message.topic.value
            if topic in (self.topics.sync(self.replica), self.topics.probe(self.replica)):
                token = data.decode(errors="replace")
                future = self._sync.pop(token, None) or (
                    self._drain.pop(token, None) if client is not self._client else None
                )
                if future is not None and not future.done():
                    future.set_result(None)
                continue
            if (
                self._overlap is not None
                and not message.retain
                and self._twice(client, topic, data)
            ):
                continue
            try:
                self._on_message(topic, data)
            except Exception:  # one record's handling must not end the replica's link
                logger.exception("cluster record on %s failed", topic)

    def _twice(self, client: aiomqtt.Client, topic: str, data: bytes) -> bool:
        """While moving between nodes: did this live message come on the other connection
        already? (A call's request or reply, handled twice, would be a second call.)"""
        if self._overlap is None:
            return False
        key = (topic, data)
        came = self._overlap.pop(key, None)
        if came is not None and came is not client:
            return True
        if len(self._overlap) < _OVERLAP_KEPT:
            self._overlap[key] = client
        return False

    async def sync(self) -> None:
        """Return once every retained record sent before now has been handled.

        A token that never comes back (its publish refused, or dropped by a broker whose queue
        for this replica overflowed in a storm of retained records) is asked for again, so a
        replica never waits forever to join.
        """
        while not await self._echoed(_SYNC_AGAIN):
            # A warning: a replica stuck here never joins, and only warnings reach the logs
            # most deployments (and the test suite) keep.
            logger.warning("replica %s: no echo of its sync token in %s s; asking again",
                           self.replica, _SYNC_AGAIN)  # fmt: skip

    async def _echoed(self, patience: float) -> bool:
        """Did a live message to our own sync topic come back within ``patience`` seconds?"""
        token = secrets.token_hex(8)
        future = self._sync[token] = asyncio.get_running_loop().create_future()
        try:
            await self.publish(self.topics.sync(self.replica), token.encode(), retain=False)
            async with asyncio.timeout(patience):
                await future
            return True
        except TimeoutError:
            return False
        finally:
            self._sync.pop(token, None)

    async def _check_retained_to_wildcards(self) -> None:
        """A retained probe under the prefix must come back on a wildcard subscription made
        after it: the fleet's records reach a joining replica that way. RabbitMQ 3.10's MQTT
        plugin, for one, sends retained messages only to exact topics, and a replica on it would
        pass the barrier knowing no device.

        A probe that does not come back is a verdict only when the broker is otherwise serving,
        and on ``_PROBE_PROOF`` connections in a row: a NATS node whose peer just died answers
        nothing for seconds while JetStream elects leaders, or acknowledges the probe and
        stores it late, and is a fine broker a moment later.

        Raises:
            BrokerUnfit: live messages come back, the retained probe does not, again.
            aiomqtt.MqttError: the broker went away, echoes nothing yet, or missed the probe
                once (try the next node).
        """
        client = self._client
        if client is None:
            raise aiomqtt.MqttError("the broker went away")
        token, topic, wildcard = secrets.token_hex(8), self.topics.probe(self.replica), \
            self.topics.probe("+")  # fmt: skip
        future = self._sync[token] = asyncio.get_running_loop().create_future()
        try:
            await publish_honouring_cancellation(client, topic, token.encode(), qos=1, retain=True)
            await client.subscribe(wildcard, qos=_DELIVERY_QOS)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_SYNC_AGAIN):
                    await asyncio.shield(future)
            if future.done():
                self._probe_misses.pop(self.where, None)
                return
            if not await self._echoed(_SYNC_AGAIN):
                raise aiomqtt.MqttError(f"the broker echoes nothing yet (in {2 * _SYNC_AGAIN:g} s)")
            if future.done():  # it came just behind the live echo
                self._probe_misses.pop(self.where, None)
                return
            misses = self._probe_misses[self.where] = self._probe_misses.get(self.where, 0) + 1
            if misses < _PROBE_PROOF:
                raise aiomqtt.MqttError(
                    "its retained probe did not come back yet while live messages do (a broker "
                    "electing leaders stores it late, as NATS does after a node died)"
                )
            raise BrokerUnfit(
                f"the cluster broker at {self.where} does not send retained messages to "
                f"wildcard subscriptions (a retained probe on {topic} did not come back on "
                f"{wildcard} within {_SYNC_AGAIN:g} s, {misses} connections in a row, while "
                f"live messages did): replica {self.replica} cannot learn the fleet there and "
                "will not serve; brokers that qualify: docs/cluster.md"
            )
        finally:
            self._sync.pop(token, None)
            with contextlib.suppress(aiomqtt.MqttError):
                await client.unsubscribe(wildcard)
                await publish_honouring_cancellation(client, topic, b"", qos=1, retain=True)

    async def resubscribe(self) -> bool:
        """Subscribe again to the retained records: the broker sends them all once more.

        A broker drops what it queues for a client past its limit (mosquitto's
        ``max_queued_messages``, EMQX's ``max_mqueue_len``: 1000 by default), so a replica that
        fell behind in a storm may have missed records; this heals it.
        """
        client = self._client
        if client is None:
            return False
        try:
            topics = [(topic, _DELIVERY_QOS) for topic in self.topics.retained()]
            await subscribe_all(client, topics, _SUBSCRIBE_PATIENCE)
        except aiomqtt.MqttError as exc:
            # Refused for that long (a node that lost its peers) the replica may be deaf to
            # the fleet's records: never silent, it leaves the node for the next.
            if self._client is client and self._refused and not self._refused.done():
                self._refused.set_exception(exc)
            return False
        return True

    async def publish(self, topic: str, payload: bytes, *, retain: bool, qos: int = 1) -> bool:
        """Publish now; False when the broker is not there (the caller publishes again later)."""
        client = self._client
        if client is None:
            return False
        try:
            await publish_honouring_cancellation(client, topic, payload, qos=qos, retain=retain)
        except aiomqtt.MqttError:
            if self._client is None or self._client is client:
                return False
            return await self.publish(topic, payload, retain=retain, qos=qos)  # moved meanwhile
        return True

    def _client_for(self, login: BrokerLogin | None = None) -> aiomqtt.Client:
        login = login or self.nodes.current
        will = aiomqtt.Will(self.topics.replica(self.replica), b"", qos=1, retain=True)
        client = aiomqtt.Client(
            login.host,
            login.port,
            username=login.username,
            password=login.password,
            identifier=f"esp-mcp-replica-{self.replica}-{secrets.token_hex(3)}",
            keepalive=_KEEPALIVE,
            timeout=10,
            clean_session=True,
            tls_context=login.ssl_context(),
            will=will,
            # A call across replicas is a few small frames each way: Nagle would hold each one
            # back for the peer's delayed ACK (tens of ms); paho does not set this itself.
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
        client.pending_calls_threshold = 5000
        return mend_socket_registration(client)


async def _leave(client: aiomqtt.Client) -> None:
    """Disconnect, whatever state the connection is in (a node left, a move that failed)."""
    with contextlib.suppress(aiomqtt.MqttError):
        await client.__aexit__(None, None, None)
    consume_disconnect(client)
