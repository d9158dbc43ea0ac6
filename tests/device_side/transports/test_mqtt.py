"""The MQTT transport against a real mosquitto: presence, messages, bad input, broker loss."""

from __future__ import annotations

import asyncio
import gc
from collections import deque
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

import aiomqtt
import pytest

from gateway.device_side.broker import Topics
from gateway.device_side.transports.mqtt import BrokerLogin, MqttLink, MqttTransport
from gateway.devices.link import LinkClosed
from tests.conftest import bound
from tests.mqtt_helpers import Mosquitto, MqttDevice
from tests.ports import refusing_port

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DEVICE = "aa:bb:cc:dd:ee:01"


@asynccontextmanager
async def transport(
    broker: Mosquitto, known: Iterable[str] = (), probe_interval: float | None = None,
    login: BrokerLogin | None = None, quiet: tuple[float, float] = (5.0, 300.0),
) -> AsyncIterator[MqttTransport]:  # fmt: skip
    async with MqttTransport(
        login or BrokerLogin("127.0.0.1", broker.port),
        Topics(),
        probe_interval=probe_interval,
        known=lambda: list(known),
        retry=(0.05, 0.2),
        quiet=quiet,
    ) as running:
        async with asyncio.timeout(bound(10)):
            await running.connected.wait()
        yield running


async def next_link(t: MqttTransport) -> MqttLink:
    async with asyncio.timeout(bound(10)):
        link, identity = await anext(aiter(t.links()))
    assert identity.transport == "mqtt" and identity.device_id == link.device_id
    return link


async def next_text(link: MqttLink) -> str | None:
    """The next message on ``link``, or None once it has closed."""
    async with asyncio.timeout(bound(10)):
        return await anext(aiter(link), None)


async def test_status_online_opens_a_link_and_offline_closes_it(tmp_path: Path) -> None:
    """Our firmware's retained status decides its presence."""
    async with Mosquitto(tmp_path) as broker, transport(broker) as t:
        async with MqttDevice("127.0.0.1", broker.port, DEVICE, "x", stock=False) as device:
            link = await next_link(t)
            assert link.device_id == DEVICE and t.present() == {DEVICE}
            await device.set_status(b"offline")  # what its last will says
            assert await next_text(link) is None
            assert link.closed and t.present() == frozenset()


async def test_messages_flow_both_ways(tmp_path: Path) -> None:
    """What the device publishes reaches the link; what the link sends reaches the device."""
    async with Mosquitto(tmp_path) as broker, transport(broker) as t:
        async with MqttDevice("127.0.0.1", broker.port, DEVICE, "x", stock=False) as device:
            link = await next_link(t)
            await link.send('{"type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"ping"}}')
            assert await next_text(link) == (
                '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":1,'
                '"error":{"message":"Method not implemented: ping"}}}'
            )
            assert device.received[0]["payload"]["method"] == "ping"


async def test_bad_input_loses_nothing(tmp_path: Path) -> None:
    """Non-UTF-8 payloads, unknown topics and bad ids are dropped; the link carries on."""
    async with Mosquitto(tmp_path) as broker, transport(broker) as t:
        async with aiomqtt.Client("127.0.0.1", broker.port) as other:
            await other.publish(f"xiaozhi/{DEVICE}/up", b"\xff\xfe not utf-8")
            link = await next_link(t)  # still a sign of life
            for topic in ("xiaozhi/BAD ID/up", "xiaozhi/a/b/up", f"xiaozhi/{DEVICE}/weird",
                          f"xiaozhi/{DEVICE}/down", "xiaozhi/+bad/up"):  # fmt: skip
                if "+" not in topic:
                    await other.publish(topic, b'{"type":"mcp"}')
            await other.publish(f"xiaozhi/{DEVICE}/status", b"sideways")
            await other.publish(f"xiaozhi/{DEVICE}/up", b"{not json")
            await other.publish(f"xiaozhi/{DEVICE}/up", b'{"type":"hello"}')
            assert await next_text(link) == "{not json"  # the protocol core drops it
            assert await next_text(link) == '{"type":"hello"}'
            assert t.present() == {DEVICE}


async def test_probe_finds_known_devices_and_forgets_silent_ones(tmp_path: Path) -> None:
    """A stock device with no last will answers probes; when it stops, it goes offline."""
    async with Mosquitto(tmp_path) as broker, transport(broker, [DEVICE], 0.1) as t:
        # subscribe=True stands in for EMQX's auto-subscribe: stock firmware never subscribes.
        async with MqttDevice("127.0.0.1", broker.port, DEVICE, "x", subscribe=True):
            link = await next_link(t)
        while (await next_text(link)) is not None:
            pass  # probe replies, until the silence closes the link
        assert t.present() == frozenset()


async def test_losing_the_broker_closes_links_and_reconnecting_finds_devices(
    tmp_path: Path,
) -> None:
    """Kill mosquitto: links close at once; restart it: the device is back with a new link."""
    broker = Mosquitto(tmp_path)
    await broker.start()
    try:
        async with transport(broker) as t:
            async with MqttDevice("127.0.0.1", broker.port, DEVICE, "x", stock=False):
                link = await next_link(t)
                await broker.kill()
                assert await next_text(link) is None
                with pytest.raises(LinkClosed):
                    await link.send("{}")
                await broker.start()
                again = await next_link(t)
                assert again is not link and again.device_id == DEVICE
    finally:
        await broker.kill()


async def test_gateway_logs_in_to_a_broker_with_passwords(tmp_path: Path) -> None:
    """Credentials for an external broker are used."""
    # mosquitto's password_file cannot hold a ":" in a user name, so not a MAC (docs/mqtt.md).
    device = "esp32-kitchen"
    users = {"gateway": "gw-secret", device: "dev-secret"}
    async with Mosquitto(tmp_path, users=users) as broker:
        login = BrokerLogin("127.0.0.1", broker.port, "gateway", "gw-secret")
        async with transport(broker, login=login) as t:
            async with MqttDevice("127.0.0.1", broker.port, device, "dev-secret", stock=False):
                assert (await next_link(t)).device_id == device


async def test_gateway_connects_to_a_tls_broker_with_its_ca(tmp_path: Path) -> None:
    """tls = true with ca_file: a broker with a private CA is verified and used."""
    async with Mosquitto(tmp_path, tls=True) as broker:
        login = BrokerLogin("127.0.0.1", broker.port, tls=True, ca_file=broker.cert)
        async with transport(broker, login=login) as t:
            assert t.connected.is_set()


def test_link_drops_a_flood_and_nothing_after_closing() -> None:
    """A device cannot queue without bound; a closed link takes nothing more."""
    link = MqttLink(MqttTransport(BrokerLogin("127.0.0.1", 1), Topics()), DEVICE)
    for index in range(300):
        link.feed(str(index))
    assert link.queued == 256
    link.close()
    link.feed("late")
    assert link.queued == 257  # the 256 messages and the end marker


async def test_a_flood_of_big_messages_is_bounded_by_size_too() -> None:
    """256 messages of the broker's largest packet would be 64 MiB held for one device: what
    waits is bounded by its size as well, and room is made again as the session reads."""
    link = MqttLink(MqttTransport(BrokerLogin("127.0.0.1", 1), Topics()), DEVICE)
    big = "x" * (256 * 1024)
    for _ in range(10):
        link.feed(big)
    assert link.queued == 4  # 1 MiB
    link.feed("small")
    assert link.queued == 4
    reader = aiter(link)
    async with asyncio.timeout(bound(5)):
        assert await anext(reader) == big
    link.feed("small")
    assert link.queued == 4


def test_a_flood_is_logged_at_a_bounded_rate(caplog: pytest.LogCaptureFixture) -> None:
    """A device that floods its up topic gets its messages dropped, not a log line for each."""
    link = MqttLink(MqttTransport(BrokerLogin("127.0.0.1", 1), Topics()), DEVICE)
    for index in range(1000):
        link.feed(str(index))
    assert link.queued == 256
    floods = [r for r in caplog.records if "floods its up topic" in r.getMessage()]
    assert len(floods) <= 1  # (none if an earlier test logged one just now)


async def test_an_idle_link_holds_no_queue_and_its_messages_arrive_in_order() -> None:
    """An asyncio.Queue per link was four deques and an Event for every connected device."""
    link = MqttLink(MqttTransport(BrokerLogin("127.0.0.1", 1), Topics()), DEVICE)
    reader = aiter(link)
    link.feed("one")
    link.feed("two")
    async with asyncio.timeout(bound(5)):
        assert [await anext(reader), await anext(reader)] == ["one", "two"]
        own = [v for k, v in vars(link).items() if k != "_transport"]  # the link's own state
        held = [*own, *gc.get_referents(*own)]
        assert link.queued == 0
        assert not [o for o in held if isinstance(o, deque | asyncio.Queue | asyncio.Event)]
        later = asyncio.create_task(anext(reader))
        while link._waiter is None:  # the reader waits on one future, nothing more
            await asyncio.wait([later], timeout=0)
        link.feed("three")
        assert await later == "three"
        link.close()
        with pytest.raises(StopAsyncIteration):
            await anext(reader)


async def test_publish_without_a_broker_raises_link_closed() -> None:
    """Sending while the gateway has no broker fails at once."""
    with refusing_port() as port:
        t = MqttTransport(BrokerLogin("127.0.0.1", port), Topics(), retry=(0.05, 0.1))
        async with t:
            with pytest.raises(LinkClosed):
                await t.publish(DEVICE, "{}")


async def test_a_session_the_gateway_ended_is_not_reopened_by_stray_messages(
    tmp_path: Path,
) -> None:
    """After the gateway ends a session, the device's next messages open no link at once."""
    async with Mosquitto(tmp_path) as broker, transport(broker, quiet=(3600, 3600)) as t:
        async with MqttDevice("127.0.0.1", broker.port, DEVICE, "x", stock=False) as device:
            ended = await next_link(t)
            await ended.aclose()  # as when discovery gives up
            await device.send("stray reply to the ended session")
            await device.set_status(b"online")  # a fresh sign of life: a link at once
            await device.send("marker")
            fresh = await next_link(t)
            assert fresh is not ended and await next_text(fresh) == "marker"


async def test_a_present_device_is_tried_again_after_the_quiet_period(tmp_path: Path) -> None:
    """A device still there when its quiet period ends gets a new session by itself."""
    async with Mosquitto(tmp_path) as broker, transport(broker, quiet=(0.05, 0.05)) as t:
        async with MqttDevice("127.0.0.1", broker.port, DEVICE, "x", stock=False):
            ended = await next_link(t)
            await ended.aclose()
            again = await next_link(t)
            assert again is not ended and not again.closed
