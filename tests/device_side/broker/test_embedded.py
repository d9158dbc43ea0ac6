"""The embedded broker: who may log in, who may use which topic, and presence."""

from __future__ import annotations

import asyncio
import errno
import select
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiomqtt
import pytest

from gateway.config import ListenAddress
from gateway.device_side.broker import GATEWAY_LOGIN, EmbeddedBroker, Presence, PresenceFeed, Topics
from gateway.errors import GatewayError, PortTaken
from tests.conftest import bound
from tests.device_side.broker.raw import Listener, connect_packet, logged_in
from tests.device_side.broker.raw import dropped as raw_dropped

pytestmark = pytest.mark.anyio

TOKEN = "device-token"
DEVICE = "aa:bb:cc:dd:ee:01"
OTHER = "aa:bb:cc:dd:ee:02"


def admits(device_id: str, password: str, peer: str | None = None) -> bool:
    return password == TOKEN or password == f"pw-{device_id}"


@asynccontextmanager
async def broker() -> AsyncIterator[EmbeddedBroker]:
    async with EmbeddedBroker(ListenAddress("127.0.0.1", 0), Topics(), admits) as running:
        yield running


def client(b: EmbeddedBroker, user: str, password: str, client_id: str | None = None):  # type: ignore[no-untyped-def]
    return aiomqtt.Client("127.0.0.1", b.port, username=user, password=password,
                          identifier=client_id or user, timeout=bound(5))  # fmt: skip


async def next_presence(feed: PresenceFeed) -> Presence:
    async with asyncio.timeout(bound(5)):
        return await anext(feed)


async def first_message(c: aiomqtt.Client) -> aiomqtt.Message:
    async with asyncio.timeout(bound(5)):
        return await anext(aiter(c.messages))


async def dropped(c: aiomqtt.Client) -> None:
    """Wait until the broker drops ``c`` (which also consumes aiomqtt's disconnect error)."""
    with pytest.raises(aiomqtt.MqttError):
        await first_message(c)


async def test_wrong_mqtt_password_is_refused() -> None:
    """A device with a wrong password gets CONNACK "not authorized"."""
    async with broker() as b:
        with pytest.raises(aiomqtt.MqttCodeError):
            async with client(b, DEVICE, "wrong"):
                pass
        async with client(b, DEVICE, TOKEN):
            pass  # the right one is accepted


@pytest.mark.parametrize(
    ("user", "password", "client_id"),
    [
        (None, None, DEVICE),  # anonymous
        (DEVICE, TOKEN, OTHER),  # client id is not the username
        ("AA:BB:CC:DD:EE:01", TOKEN, "AA:BB:CC:DD:EE:01"),  # not a lower-case device id
        (GATEWAY_LOGIN, TOKEN, "x"),  # a device token does not open the gateway's login
    ],
)
async def test_logins_that_are_not_a_device_or_the_gateway_are_refused(
    user: str | None, password: str | None, client_id: str
) -> None:
    """Only a device id with its password, or the gateway with its own, may log in."""
    async with broker() as b:
        with pytest.raises(aiomqtt.MqttCodeError):
            async with aiomqtt.Client("127.0.0.1", b.port, username=user, password=password,
                                      identifier=client_id, timeout=bound(5)):  # fmt: skip
                pass


async def test_device_that_never_subscribes_gets_its_down_topic() -> None:
    """The broker subscribes each device to its own down topic when it connects."""
    async with broker() as b:
        feed = b.presence()
        async with client(b, DEVICE, TOKEN) as device:
            assert await next_presence(feed) == Presence(DEVICE, True)
            b.route(f"xiaozhi/{DEVICE}/down", b"hi", 1, False)
            message = await first_message(device)
            assert message.payload == b"hi" and message.qos == 0


async def test_device_cannot_publish_on_another_devices_topic() -> None:
    """A publish to another device's topics is dropped; its own arrives."""
    async with broker() as b:
        gw = Listener()
        b.attach(gw, [("xiaozhi/#", 0), ("elsewhere", 0)])
        async with client(b, DEVICE, TOKEN) as device:
            await device.publish(f"xiaozhi/{OTHER}/up", b"spoofed")
            await device.publish(f"xiaozhi/{OTHER}/down", b"spoofed")
            await device.publish(f"xiaozhi/{DEVICE}/down", b"spoofed")
            await device.publish("elsewhere", b"spoofed")
            await device.publish(f"xiaozhi/{DEVICE}/up", b"mine")
            assert await gw.next() == (f"xiaozhi/{DEVICE}/up", b"mine", 0, False)


async def test_device_cannot_read_another_devices_down_topic() -> None:
    """Subscribing to another device's down topic (or a wildcard) is refused."""
    async with broker() as b, client(b, DEVICE, TOKEN) as device:
        codes = await device.subscribe([(f"xiaozhi/{OTHER}/down", 0), ("xiaozhi/#", 0)])
        assert [getattr(c, "value", c) for c in codes] == [0x80, 0x80]


async def test_presence_follows_connections_and_replays_who_is_there() -> None:
    """Connect and leave become Presence items; a new feed starts with those online."""
    async with broker() as b:
        feed = b.presence()
        async with client(b, DEVICE, TOKEN):
            assert await next_presence(feed) == Presence(DEVICE, True)
            late = b.presence()
            assert await next_presence(late) == Presence(DEVICE, True)
            assert b.online() == {DEVICE}
        assert await next_presence(feed) == Presence(DEVICE, False)
        late.close()
        feed.close()


async def test_reconnecting_device_stays_online() -> None:
    """A device whose new connection takes over its client id is not reported gone; the older
    connection is dropped (MQTT-3.1.4-2) without its will."""
    async with broker() as b:
        feed = b.presence()
        listener = Listener()
        b.attach(listener, [("xiaozhi/#", 0)])
        will = (f"xiaozhi/{DEVICE}/status", b"gone")
        old, old_writer = await logged_in(b.port, DEVICE, TOKEN, will=will)
        assert await next_presence(feed) == Presence(DEVICE, True)
        reader, writer = await logged_in(b.port, DEVICE, TOKEN)
        await raw_dropped(old)
        assert await next_presence(feed) == Presence(DEVICE, True)
        assert b.online() == {DEVICE} and len(b.connections) == 1
        b.route(f"xiaozhi/{DEVICE}/up", b"marker", 0, False)
        assert await listener.next() == (f"xiaozhi/{DEVICE}/up", b"marker", 0, False)
        writer.close()
        assert await next_presence(feed) == Presence(DEVICE, False)
        old_writer.close()
        feed.close()


async def test_stopping_the_broker_takes_every_device_offline() -> None:
    """stop() reports every device gone, and a restart listens on the same port."""
    async with broker() as b:
        feed = b.presence()
        async with client(b, DEVICE, TOKEN) as device:
            await next_presence(feed)
            port = b.port
            await b.stop()
            assert await next_presence(feed) == Presence(DEVICE, False)
            await dropped(device)
        await b.start()
        assert b.port == port
        async with client(b, DEVICE, TOKEN):
            assert await next_presence(feed) == Presence(DEVICE, True)


async def test_port_in_use_is_a_gateway_error() -> None:
    """A broker that cannot bind says where, in one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        b = EmbeddedBroker(ListenAddress("127.0.0.1", port), Topics(), admits)
        with pytest.raises(PortTaken, match=f"cannot use port {port}") as caught:
            await b.start()
    assert isinstance(caught.value, GatewayError) and caught.value.listener == "mqtt"


async def test_a_burst_of_devices_connecting_at_once_is_queued_not_dropped() -> None:
    """A fleet joining at once arrives faster than the loop accepts: the listener queues the
    connections (a dropped attempt costs the device a second, then three, the tail of a storm).
    Here the loop accepts nothing until all of them have connected."""
    burst = 300  # over asyncio's default backlog of 100
    async with broker() as b:
        sockets = [socket.socket() for _ in range(burst)]
        try:
            for sock in sockets:
                sock.setblocking(False)
                assert sock.connect_ex(("127.0.0.1", b.port)) in (0, errno.EINPROGRESS)
            # Blocking the loop on purpose: the broker accepts none while they connect.
            poll = select.poll()
            for sock in sockets:
                poll.register(sock, select.POLLOUT)
            connected: set[int] = set()
            deadline = time.monotonic() + bound(5)
            while len(connected) < burst and time.monotonic() < deadline:
                for fd, _ in poll.poll(100):
                    poll.unregister(fd)
                    connected.add(fd)
            errors = [s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) for s in sockets]
            assert len(connected) == burst and not any(errors)
        finally:
            for sock in sockets:
                sock.close()


async def test_a_device_is_accepted_only_once_the_gateway_listens() -> None:
    """After a gateway restart a stock device reconnects first and publishes its hello the
    instant it is accepted: its CONNECT waits until the gateway's own client is subscribed, so
    the hello is heard, not lost to a broker with nobody on the up topics."""
    async with broker() as b:
        heard = asyncio.Event()
        b.hold_logins_until(heard)
        device = client(b, DEVICE, TOKEN)
        connecting = asyncio.create_task(device.__aenter__())
        # Unheld, a login on loopback is answered in milliseconds; held, not in this second.
        await asyncio.wait([connecting], timeout=1.0)
        assert not connecting.done()
        gw = Listener()
        b.attach(gw, [("xiaozhi/+/up", 1)])
        heard.set()
        async with asyncio.timeout(bound(5)):
            await connecting
        try:
            await device.publish(f"xiaozhi/{DEVICE}/up", b'{"type":"hello"}', qos=0)
            assert await gw.next() == (f"xiaozhi/{DEVICE}/up", b'{"type":"hello"}', 0, False)
        finally:
            await device.__aexit__(None, None, None)


async def test_an_mqtt_5_connect_gets_unacceptable_protocol_version() -> None:
    """CONNACK return code 1 (MQTT 3.1.1 §3.2.2.3) at once; amqtt, the broker before, hung."""
    async with broker() as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        writer.write(connect_packet(DEVICE, DEVICE, TOKEN, level=5))
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(4) == b"\x20\x02\x00\x01"
        await raw_dropped(reader)
        writer.close()


async def test_retained_messages_reach_only_those_the_acl_lets_receive_them() -> None:
    """A device gets the retained message of its own down topic, never another device's
    retained status; the gateway gets every retained status."""
    async with broker() as b:
        async with client(b, OTHER, TOKEN) as other:
            await other.publish(f"xiaozhi/{OTHER}/status", b"online", qos=1, retain=True)
        b.route(f"xiaozhi/{DEVICE}/down", b"kept for you", 1, True)
        b.route(f"xiaozhi/{OTHER}/down", b"not yours", 1, True)
        async with client(b, DEVICE, TOKEN) as device:
            message = await first_message(device)
            assert (message.topic.value, message.payload, message.retain) == (
                f"xiaozhi/{DEVICE}/down",
                b"kept for you",
                True,
            )
            codes = await device.subscribe("xiaozhi/+/status")
            assert [getattr(c, "value", c) for c in codes] == [0x80]
        listener = Listener()
        b.attach(listener, [("xiaozhi/+/status", 1)])
        assert await listener.next() == (f"xiaozhi/{OTHER}/status", b"online", 1, True)
        b.route(f"xiaozhi/{OTHER}/status", b"", 0, True)  # an empty retained message clears
        assert b.routes.retained_for("xiaozhi/+/status") == []


async def test_a_will_is_published_only_on_the_devices_own_topics() -> None:
    """An abnormal end publishes the will; a will naming another device's topic is dropped; a
    DISCONNECT discards the will."""
    async with broker() as b:
        listener = Listener()
        b.attach(listener, [("xiaozhi/#", 0)])
        wills = [(f"xiaozhi/{OTHER}/status", b"spoofed"), (f"xiaozhi/{DEVICE}/status", b"gone")]
        for will in wills:
            _, writer = await logged_in(b.port, DEVICE, TOKEN, will=will)
            writer.transport.abort()
        assert await listener.next() == (f"xiaozhi/{DEVICE}/status", b"gone", 0, False)
        reader, writer = await logged_in(b.port, DEVICE, TOKEN, will=wills[1])
        writer.write(b"\xe0\x00")  # DISCONNECT
        await raw_dropped(reader)
        writer.close()
        b.route(f"xiaozhi/{DEVICE}/up", b"after", 0, False)
        assert await listener.next() == (f"xiaozhi/{DEVICE}/up", b"after", 0, False)


async def test_qos_1_is_acknowledged_and_deliveries_take_the_lower_qos() -> None:
    """A device's QoS 1 PUBLISH gets its PUBACK; the gateway's QoS 1 message reaches a device
    subscribed at QoS 0 (its down topic) at QoS 0, and the gateway at its own QoS."""
    async with broker() as b:
        listener = Listener()
        b.attach(listener, [("xiaozhi/+/up", 0), ("xiaozhi/+/status", 1)])
        async with client(b, DEVICE, TOKEN) as device:
            await device.publish(f"xiaozhi/{DEVICE}/status", b"online", qos=1)  # waits for PUBACK
            await device.publish(f"xiaozhi/{DEVICE}/up", b"hi", qos=1)
            assert await listener.next() == (f"xiaozhi/{DEVICE}/status", b"online", 1, False)
            assert await listener.next() == (f"xiaozhi/{DEVICE}/up", b"hi", 0, False)
            b.route(f"xiaozhi/{DEVICE}/down", b"call", 1, False)
            message = await first_message(device)
            assert (message.payload, message.qos) == (b"call", 0)
            b.detach(listener, [("xiaozhi/+/up", 0)])


async def test_refused_logins_cannot_flood_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """Anyone can send CONNECTs before logging in: refusals are logged at a bounded rate, and a
    client id of 15,000 characters does not become a 15,000-character log line."""
    huge = "\x01" * 15_000  # %r would make each of these four characters (under 16 KiB sent)
    async with broker() as b:
        for _ in range(5):
            reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
            writer.write(connect_packet(huge, DEVICE, TOKEN))
            async with asyncio.timeout(bound(5)):
                assert await reader.readexactly(4) == b"\x20\x02\x00\x05"  # not authorized
            await raw_dropped(reader)
            writer.close()
    refusals = [r for r in caplog.records if "refused MQTT client" in r.getMessage()]
    assert len(refusals) <= 1  # (one, or none if an earlier test logged one just now)
    assert all(len(r.getMessage()) < 1000 for r in caplog.records)
