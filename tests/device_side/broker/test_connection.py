"""The embedded broker's limits: packets over the size are dropped before their body, and
connections have caps and a CONNECT deadline."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from gateway.config import ListenAddress
from gateway.device_side.broker import EmbeddedBroker, Topics
from gateway.device_side.broker.connection import BEFORE_CONNACK_BYTES
from gateway.net.limits import ListenerLimits
from gateway.protocol import mqtt_reader
from gateway.protocol.mqtt import Packet, remaining_length
from tests.conftest import bound
from tests.device_side.broker.raw import (
    Listener,
    connect_packet,
    dropped,
    field,
    logged_in,
    publish_head,
)

pytestmark = pytest.mark.anyio

TOKEN = "device-token"
DEVICE = "aa:bb:cc:dd:ee:01"
OTHER = "aa:bb:cc:dd:ee:02"
LIMIT = 1024


@asynccontextmanager
async def broker(
    limit: int = LIMIT, limits: ListenerLimits | None = None
) -> AsyncIterator[EmbeddedBroker]:
    def admits(device_id: str, password: str, peer: str | None = None) -> bool:
        return password == TOKEN

    listen = ListenAddress("127.0.0.1", 0)
    embedded = EmbeddedBroker(listen, Topics(), admits, max_packet_bytes=limit, limits=limits)
    async with embedded:
        yield embedded


async def test_a_publish_over_the_limit_drops_the_client_before_its_body() -> None:
    """Only the header of a too-big PUBLISH is sent: the broker hangs up without the body."""
    async with broker() as b:
        reader, writer = await logged_in(b.port, DEVICE, TOKEN)
        writer.write(publish_head(Topics().up(DEVICE), LIMIT))
        await dropped(reader)
        writer.close()


async def test_a_publish_up_to_the_limit_is_delivered() -> None:
    """A packet of exactly max_packet_bytes passes, and the client stays connected."""
    topic = Topics().up(DEVICE)
    async with broker() as b:
        gateway = Listener()
        b.attach(gateway, [(topic, 0)])
        reader, writer = await logged_in(b.port, DEVICE, TOKEN)
        payload = b"x" * (LIMIT - len(field(topic)))
        writer.write(publish_head(topic, len(payload)) + payload + b"\xc0\x00")  # + PINGREQ
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(2) == b"\xd0\x00"  # PINGRESP: still connected
        assert await gateway.next() == (topic, payload, 0, False)
        writer.close()


async def test_a_connect_over_the_limit_is_refused_before_login() -> None:
    """The limit holds for anyone, not only logged-in devices."""
    async with broker() as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        writer.write(connect_packet(DEVICE, DEVICE, "p" * LIMIT))
        await dropped(reader)
        writer.close()
        _, writer = await logged_in(b.port, DEVICE, TOKEN)  # the broker serves on
        writer.close()


async def test_a_client_without_an_accepted_connect_is_closed_at_the_deadline() -> None:
    """A logged-in device is past the deadline and stays."""
    limits = ListenerLimits("mqtt", 100, 100, handshake_timeout=0.3, auth_timeout=30)
    async with broker(limits=limits) as b:
        reader, writer = await logged_in(b.port, DEVICE, TOKEN)
        loop = asyncio.get_running_loop()
        start = loop.time()
        silent, silent_writer = await asyncio.open_connection("127.0.0.1", b.port)
        partial, partial_writer = await asyncio.open_connection("127.0.0.1", b.port)
        partial_writer.write(connect_packet(DEVICE, DEVICE, TOKEN)[:10])
        await dropped(silent)
        await dropped(partial)
        assert loop.time() - start >= 0.25
        writer.write(b"\xc0\x00")  # PINGREQ
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(2) == b"\xd0\x00"
        for w in (writer, silent_writer, partial_writer):
            w.close()


async def test_connection_caps_hold_on_the_broker_too() -> None:
    """Past per_address clients without an accepted CONNECT, the next is dropped at once."""
    limits = ListenerLimits("mqtt", 100, per_address=2, handshake_timeout=10, auth_timeout=30)
    async with broker(limits=limits) as b:
        _, device = await logged_in(b.port, DEVICE, TOKEN)  # accepted: it does not count
        held = [await asyncio.open_connection("127.0.0.1", b.port) for _ in range(2)]
        extra, extra_writer = await asyncio.open_connection("127.0.0.1", b.port)
        await dropped(extra)
        assert [reader.at_eof() for reader, _ in held] == [False, False]
        for w in (device, extra_writer, *(w for _, w in held)):
            w.close()


async def test_a_silent_client_is_closed_after_one_and_a_half_keepalives() -> None:
    """Keepalive 1 s: silence closes it (and publishes its will); pings keep another open."""
    async with broker() as b:
        listener = Listener()
        b.attach(listener, [("xiaozhi/+/status", 0)])
        will = (f"xiaozhi/{DEVICE}/status", b"offline")
        silent, silent_writer = await logged_in(b.port, DEVICE, TOKEN, keepalive=1, will=will)
        other = "aa:bb:cc:dd:ee:02"
        pinging, pinging_writer = await logged_in(b.port, other, TOKEN, keepalive=1)
        loop = asyncio.get_running_loop()
        start = loop.time()
        closing = asyncio.create_task(dropped(silent))
        while not closing.done():
            pinging_writer.write(b"\xc0\x00")
            async with asyncio.timeout(bound(5)):
                assert await pinging.readexactly(2) == b"\xd0\x00"
            await asyncio.wait([closing], timeout=0.3)
        await closing
        assert loop.time() - start >= 1.4
        assert await listener.next() == (f"xiaozhi/{DEVICE}/status", b"offline", 0, False)
        assert b.online() == {other}
        for w in (silent_writer, pinging_writer):
            w.close()


async def test_a_client_that_does_not_read_is_closed_not_buffered() -> None:
    """Messages to a device that stopped reading pile up to write_limit, then it is dropped;
    another device is served on."""
    async with broker() as b:
        stalled, stalled_writer = await logged_in(b.port, DEVICE, TOKEN)
        other = "aa:bb:cc:dd:ee:02"
        reader, writer = await logged_in(b.port, other, TOKEN)
        down = Topics().down(DEVICE)
        sent = 0
        # The kernel's socket buffers take some megabytes first; then the broker's bound holds.
        while DEVICE in b.online():
            b.route(down, b"x" * 1000, 0, False)
            sent += 1
            assert sent < 100_000, "the broker kept buffering for a client that does not read"
            if sent % 100 == 0:
                await asyncio.sleep(0)  # let the loop flush to the kernel as it would
        b.route(Topics().down(other), b"still here", 0, False)
        async with asyncio.timeout(bound(5)):
            assert (await reader.readexactly(2 + 2 + len(Topics().down(other)) + 10))[-10:] == (
                b"still here"
            )
        for w in (stalled_writer, writer):
            w.close()
        del stalled


async def test_packets_before_an_accepted_connect_or_malformed_close_only_that_client() -> None:
    """A PUBLISH before CONNECT, a second CONNECT, garbage: each closes its own connection."""
    async with broker() as b:
        reader, writer = await logged_in(b.port, DEVICE, TOKEN)
        bad = [
            publish_head("xiaozhi/x/up", 0),
            connect_packet("aa:bb:cc:dd:ee:03", "aa:bb:cc:dd:ee:03", TOKEN) * 2,
            b"\xff\xff\xff\xff\xff\xff",
        ]
        for data in bad:
            bad_reader, bad_writer = await asyncio.open_connection("127.0.0.1", b.port)
            bad_writer.write(data)
            await dropped(bad_reader)
            bad_writer.close()
        writer.write(b"\xc0\x00")
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(2) == b"\xd0\x00"
        writer.close()


async def test_an_idle_connection_holds_one_timer_and_no_task() -> None:
    """Work per connection: one timer handle (keepalive), no task once logged in, and no new
    task or timer per packet."""
    async with broker(limits=ListenerLimits("mqtt", 100, 100, 10, 30)) as b:
        loop = asyncio.get_running_loop()
        heap: list[asyncio.TimerHandle] = loop._scheduled  # type: ignore[attr-defined]

        def timers() -> int:
            return sum(not handle.cancelled() for handle in heap)

        tasks, before = len(asyncio.all_tasks()), timers()
        clients = [await logged_in(b.port, f"aa:bb:cc:dd:ef:{n:02x}", TOKEN) for n in range(20)]
        assert timers() - before == 20
        assert len(asyncio.all_tasks()) == tasks
        reader, writer = clients[0]
        for _ in range(50):
            writer.write(publish_head(Topics().up("aa:bb:cc:dd:ef:00"), 2) + b"hi" + b"\xc0\x00")
        async with asyncio.timeout(bound(5)):
            await reader.readexactly(2 * 50)
        assert timers() - before == 20
        assert len(asyncio.all_tasks()) == tasks
        for _, w in clients:
            w.close()


async def test_a_device_may_subscribe_to_its_own_down_topic_at_qos_1() -> None:
    """SUBSCRIBE to its own down topic is granted (QoS 2 asked: 1 given), QoS 1 deliveries are
    numbered and acknowledged, UNSUBSCRIBE ends them; an empty client id is refused."""
    async with broker() as b:
        reader, writer = await logged_in(b.port, DEVICE, TOKEN)
        down = Topics().down(DEVICE)
        writer.write(b"\x82" + bytes([2 + 2 + len(down) + 1]) + b"\x00\x01" + field(down) + b"\x02")
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(5) == b"\x90\x03\x00\x01\x01"
        b.route(down, b"call", 1, False)
        async with asyncio.timeout(bound(5)):
            packet = await reader.readexactly(2 + 2 + len(down) + 2 + 4)
        assert packet[0] == 0x32 and packet[-6:] == b"\x00\x01call"
        writer.write(b"\x40\x02\x00\x01")  # PUBACK
        writer.write(b"\xa2" + bytes([2 + 2 + len(down)]) + b"\x00\x02" + field(down))
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(4) == b"\xb0\x02\x00\x02"
        b.route(down, b"unheard", 1, False)
        writer.write(b"\xc0\x00")
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(2) == b"\xd0\x00"  # and nothing before it
        writer.close()
        anonymous, anonymous_writer = await asyncio.open_connection("127.0.0.1", b.port)
        anonymous_writer.write(connect_packet("", DEVICE, TOKEN))
        async with asyncio.timeout(bound(5)):
            assert await anonymous.readexactly(4) == b"\x20\x02\x00\x02"
        anonymous_writer.close()


async def test_a_client_gone_while_its_login_waits_is_never_accepted() -> None:
    """A device that hangs up while its login is being settled leaves nothing behind: its
    login task ends with it, and it is never accepted."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def settle() -> None:
        entered.set()
        await release.wait()

    listen = ListenAddress("127.0.0.1", 0)
    async with EmbeddedBroker(listen, Topics(), lambda *_: True, settle=settle) as b:
        _, writer = await asyncio.open_connection("127.0.0.1", b.port)
        writer.write(connect_packet(DEVICE, DEVICE, TOKEN) + b"\xc0\x00")
        async with asyncio.timeout(bound(5)):
            await entered.wait()
        [login] = [t for t in asyncio.all_tasks() if t.get_name().startswith("gateway.mqtt.")]
        writer.transport.abort()
        await asyncio.wait([login], timeout=bound(5))
        assert login.cancelled()
        release.set()
        assert b.online() == frozenset() and b.sessions == {} and b.connections == set()
        # One that floods while it waits is dropped (its packets are held, up to a few).
        entered.clear()
        release.clear()
        flood, writer = await asyncio.open_connection("127.0.0.1", b.port)
        writer.write(connect_packet(DEVICE, DEVICE, TOKEN) + b"\xc0\x00" * 17)
        await dropped(flood)
        release.set()
        writer.close()


async def _raw_login(port: int, device_id: str) -> socket.socket:
    """A device logged in on a bare socket: no client-side objects but the socket."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, connect_packet(device_id, device_id, TOKEN))
    got = b""
    async with asyncio.timeout(bound(5)):
        while len(got) < 4:
            got += await loop.sock_recv(sock, 4 - len(got))
    assert got == b"\x20\x02\x00\x00"
    return sock


async def test_an_idle_device_costs_a_few_objects_and_no_task() -> None:
    """Objects per idle connection (gc-tracked, the test's own socket included): its transport
    with its reader handle and socket, the connection and its codec, one timer, its route;
    amqtt kept a session, a handler, four queues and a task per client (hundreds of objects)."""
    async with broker() as b:
        fleet = [await _raw_login(b.port, "aa:bb:cc:dd:ef:ff")]  # warm: first-use caches
        gc.collect()
        before = Counter(type(o).__name__ for o in gc.get_objects())
        fleet += [await _raw_login(b.port, f"aa:bb:cc:dd:ef:{n:02x}") for n in range(50)]
        gc.collect()
        grown = Counter(type(o).__name__ for o in gc.get_objects()) - before
        for debugging in ("FrameSummary", "StackSummary"):  # PYTHONASYNCIODEBUG's tracebacks
            del grown[debugging]
        assert b.online() == {f"aa:bb:cc:dd:ef:{n:02x}" for n in [*range(50), 0xFF]}
        assert grown["Task"] == grown["coroutine"] == grown["list"] == 0
        assert grown["ClientConnection"] == grown["TimerHandle"] == 50
        assert sum(grown.values()) <= 25 * 50, grown.most_common(12)
        for sock in fleet:
            sock.close()


@pytest.mark.parametrize("first", [b"", b"wrong-password"], ids=["no CONNECT", "refused CONNECT"])
async def test_bytes_after_a_closing_packet_are_not_parsed(
    first: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client's first packet that ends its connection (not a CONNECT, or a refused one) is
    the last one parsed: the rest of what it sent with it (here 4,000 PINGREQs; 256 KiB of them
    cost the loop about 0.2 s) is dropped unread."""
    decoded = Counter[str]()
    decode = mqtt_reader._decode

    def counting(kind: int, flags: int, data: bytes) -> Packet:
        decoded["packets"] += 1
        return decode(kind, flags, data)

    monkeypatch.setattr(mqtt_reader, "_decode", counting)
    login = connect_packet(DEVICE, DEVICE, first.decode()) if first else b""
    async with broker() as b:
        reader, writer = await asyncio.open_connection("127.0.0.1", b.port)
        writer.write(login + b"\xc0\x00" * 4000)
        await dropped(reader)
        writer.close()
    assert decoded["packets"] == 1


async def test_a_device_that_leaves_without_reading_frees_its_place() -> None:
    """A DISCONNECT with replies still unread used to leave the connection closing forever
    (nothing flushes to a client that never reads): with keep-alive 0 only the device's next
    login ended it, and meanwhile it held a place under the broker's cap, so other devices were
    refused. Its goodbye ends it now, and the other device gets in with no second login."""
    limits = ListenerLimits("mqtt", 1, 100, handshake_timeout=10, auth_timeout=30)
    loop = asyncio.get_running_loop()
    async with broker(limit=256 * 1024, limits=limits) as b:
        with socket.socket() as sock:  # a plain socket: nothing reads it behind the test's back
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            async with asyncio.timeout(bound(5)):
                await loop.sock_connect(sock, ("127.0.0.1", b.port))
                await loop.sock_sendall(sock, connect_packet(DEVICE, DEVICE, TOKEN, keepalive=0))
                assert await loop.sock_recv(sock, 4) == b"\x20\x02\x00\x00"
                first = b.sessions[DEVICE]
                server_side = first._transport
                assert server_side is not None
                server_socket = server_side.get_extra_info("socket")
                server_socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                while server_side.get_write_buffer_size() < 64 * 1024:  # PINGRESPs unread
                    await loop.sock_sendall(sock, b"\xc0\x00" * 1000)
                    await asyncio.sleep(0)  # the broker reads them
                left = asyncio.Event()
                b.watch(lambda presence: left.set())
                await loop.sock_sendall(sock, b"\xe0\x00")  # DISCONNECT, and still not reading
                await left.wait()  # ended at once, its backlog dropped
            assert first not in b.connections and DEVICE not in b.online()
            _, other = await logged_in(b.port, OTHER, TOKEN)  # the only place under the cap
            assert OTHER in b.online()
            other.close()


async def test_retained_messages_have_a_budget() -> None:
    """Any device (a pending one too: anyone can check in a made-up MAC) may retain a message of
    max_packet_bytes on its up and status topics, and they outlive it: kept without a bound,
    one client inventing ids grew the gateway without end. Past 64 packets' worth, a retained
    message is still delivered but no longer kept (and the one it replaces is forgotten)."""
    budget = 64 * LIMIT
    payload = b"r" * (LIMIT - 100)
    async with broker() as b:
        gateway = Listener()
        b.attach(gateway, [("xiaozhi/+/status", 0)])
        for n in range(40):
            device = f"aa:bb:cc:dd:ef:{n:02x}"
            _, writer = await logged_in(b.port, device, TOKEN)
            for kind in ("up", "status"):
                topic = f"xiaozhi/{device}/{kind}"
                body = field(topic) + payload
                writer.write(b"\x31" + remaining_length(len(body)) + body)  # retained, QoS 0
            assert await gateway.next() == (f"xiaozhi/{device}/status", payload, 0, False)
            writer.close()
        kept = sum(len(topic) + len(p) for topic, (p, _) in b.routes.retained.items())
        assert budget - LIMIT < kept <= budget
        late = Listener()  # a subscriber that comes later gets those that were kept
        b.attach(late, [("xiaozhi/+/status", 0)])
        assert (await late.next())[0] == "xiaozhi/aa:bb:cc:dd:ef:00/status"


async def test_a_client_that_sends_more_than_a_connect_before_any_login_is_cut() -> None:
    """Before its CONNECT is even read, a client that sends over ``BEFORE_CONNACK_BYTES`` (a
    CONNECT far bigger than any device's, under ``max_packet_bytes``) is cut at once, without
    a deadline to wait for; a device joins as ever."""
    big = 256 * 1024
    async with broker(big) as b:
        flood, writer = await asyncio.open_connection("127.0.0.1", b.port)
        writer.write(b"\x10" + remaining_length(big - 8) + b"\x00" * (BEFORE_CONNACK_BYTES + 1))
        await dropped(flood)
        writer.close()
        reader, device = await logged_in(b.port, DEVICE, TOKEN)
        device.write(b"\xc0\x00")
        async with asyncio.timeout(bound(5)):
            assert await reader.readexactly(2) == b"\xd0\x00"
        device.close()


async def test_a_client_with_the_right_password_that_floods_before_its_connack_is_cut() -> None:
    """A login with the right password may send a hello while it is settled, not more than
    ``BEFORE_CONNACK_BYTES`` (one PUBLISH under ``max_packet_bytes`` can pass it): it is cut,
    never accepted, and the next device is."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def settle() -> None:
        entered.set()
        await release.wait()

    topic = Topics().up(DEVICE)
    payload = b"x" * BEFORE_CONNACK_BYTES
    listen = ListenAddress("127.0.0.1", 0)
    async with EmbeddedBroker(listen, Topics(), lambda *_: True, settle=settle) as b:
        gateway = Listener()
        b.attach(gateway, [(topic, 0), (Topics().up(OTHER), 0)])
        flood, writer = await asyncio.open_connection("127.0.0.1", b.port)
        writer.write(connect_packet(DEVICE, DEVICE, TOKEN))
        async with asyncio.timeout(bound(5)):
            await entered.wait()
        writer.write(publish_head(topic, len(payload)) + payload)
        await dropped(flood)
        writer.close()
        release.set()
        reader, device = await logged_in(b.port, OTHER, TOKEN)
        hello = b'{"type":"hello"}'
        device.write(publish_head(Topics().up(OTHER), len(hello)) + hello)
        assert await gateway.next() == (Topics().up(OTHER), hello, 0, False)  # none of the flood
        assert b.online() == frozenset({OTHER})
        device.close()
