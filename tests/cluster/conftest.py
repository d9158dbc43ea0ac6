"""Replicas of one cluster on a real mosquitto 2, in this process (real uvicorn each)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from gateway.app import Running
from gateway.cluster.replica import home_node
from gateway.datadir import create_private
from gateway.devices.registry import DeviceRegistry
from tests.conftest import bound, gateway

PREFIX = "fleet"
SECRET = "0f" * 32  # the replicas' shared mqtt_secret

Check = Callable[[DeviceRegistry], bool]


def cluster_options(
    broker: int | Sequence[str], replica: str, *, spread: bool = False, **overrides: Any
) -> dict[str, Any]:
    """The config of one replica: the cluster broker (a port on loopback, or the URLs of a
    cluster's nodes, which the replica tries in that order; ``spread``: as configured, the
    replica starting where its name says); MQTT devices come through it too."""
    scheme = "mqtts" if overrides.get("cluster_ca_file") else "mqtt"
    return {
        "cluster_broker": (f"{scheme}://127.0.0.1:{broker}",)
        if isinstance(broker, int)
        else tuple(broker if spread else tried_in_order(broker, replica)),  # fmt: skip
        "cluster_name": PREFIX,
        "cluster_replica": replica,
        "mqtt_keepalive_interval": None,
        **overrides,
    }


def tried_in_order(urls: Sequence[str], replica: str) -> list[str]:
    """``urls`` as ``[cluster] broker`` for ``replica`` to try them in this order (each
    replica rotates the list it is given by its name: gateway/cluster/replica.py)."""
    home = home_node(replica, len(urls))
    return [*urls[len(urls) - home :], *urls[: len(urls) - home]]


@asynccontextmanager
async def replicas(
    tmp_path: Path, broker_port: int, count: int = 3, **overrides: Any
) -> AsyncIterator[list[Running]]:
    """``count`` replicas, each with its own data dir, started one after the other."""
    async with AsyncExitStack() as stack:
        runs = []
        for n in range(1, count + 1):
            options = cluster_options(broker_port, f"gw-{n}", **overrides)
            data_dir = shared_secret(tmp_path / f"gw-{n}")
            runs.append(await stack.enter_async_context(gateway(data_dir, **options)))
        yield runs


def shared_secret(data_dir: Path) -> Path:
    """A replica's data dir with the ``mqtt_secret`` every replica shares (docs/cluster.md)."""
    create_private(data_dir / "mqtt_secret").write_text(SECRET)
    return data_dir


async def eventually(runs: list[Running], check: Check) -> None:
    """Wait on each replica's device changes until ``check`` holds for its registry."""
    for run in runs:
        registry = run.gateway.registry
        with anyio.fail_after(bound(10)):
            async with registry.device_changes() as changes:
                while not check(registry):
                    await anext(changes)


class Proxy:
    """A TCP proxy on loopback to ``port``: ``cut()`` drops every connection and refuses new
    ones (a replica cut from the broker), ``heal()`` lets them through again."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = 0
        self.open = True
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()

    def cut(self) -> None:
        self.open = False
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    def heal(self) -> None:
        self.open = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:  # nothing listens there (a node that died): refused, as it would be
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()


class FilteringProxy(Proxy):
    """A broker as seen by a client through a filter: ``drops(connection, packet_type, flags)``
    says which packets the broker sends on the ``connection``-th connection (from 1) are lost on
    the way (the client sees a broker that never sent them); what the client sends passes."""

    connections = 0  # so far
    connected = asyncio.Event()  # set at each (made per instance in __aenter__)

    async def __aenter__(self) -> FilteringProxy:
        self.connected = asyncio.Event()
        await super().__aenter__()
        return self

    def drops(self, connection: int, packet_type: int, flags: int) -> bool:
        raise NotImplementedError

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.connected.set()
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:  # nothing listens there (a node that died): refused, as it would be
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        connection = self.connections
        await asyncio.gather(
            pipe(reader, up_writer),
            relay_packets(
                up_reader,
                writer,
                lambda packet: (
                    None if self.drops(connection, packet[0] >> 4, packet[0] & 0x0F) else packet
                ),
            ),
        )


_PUBLISH = 3


class NoRetainedProxy(FilteringProxy):
    """A broker like RabbitMQ 3.10's MQTT plugin, as seen by a client: in front of a real
    mosquitto, it drops every PUBLISH the broker sends with the RETAIN flag (MQTT 3.1.1: the
    retained messages a new subscription brings), so retained records never reach wildcard
    subscriptions while live messages do. mosquitto cannot be configured so itself
    (``retain_available false`` refuses retained publishes instead)."""

    def drops(self, connection: int, packet_type: int, flags: int) -> bool:
        return packet_type == _PUBLISH and bool(flags & 1)


class DeafFirstProxy(FilteringProxy):
    """A broker node that, on a client's first connection, delivers no message at all while it
    acknowledges everything, as a NATS node does for seconds while JetStream elects leaders
    after another node died; later connections are served in full."""

    def drops(self, connection: int, packet_type: int, flags: int) -> bool:
        return connection == 1 and packet_type == _PUBLISH


class StoresLateFirstProxy(FilteringProxy):
    """A broker node that, on a client's first connection, acknowledges a retained publish and
    delivers live messages but sends no retained message to a new subscription (a NATS node
    whose JetStream could not store the retained message yet, while it elects leaders after
    another node died: "unable to store retained message ... timeout"); later connections are
    served in full."""

    def drops(self, connection: int, packet_type: int, flags: int) -> bool:
        return connection == 1 and packet_type == _PUBLISH and bool(flags & 1)


async def relay_packets(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    change: Callable[[bytes], bytes | None],
) -> None:
    """Pass MQTT packets from ``reader`` to ``writer`` as ``change`` makes them (None: lost)."""
    try:
        while (packet := await read_packet(reader)) is not None:
            if (passed := change(packet)) is not None:
                writer.write(passed)
                await writer.drain()
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.transport.abort()


async def read_packet(reader: asyncio.StreamReader) -> bytes | None:
    """The next MQTT packet, whole (its fixed header included); None at the end."""
    first = await reader.read(1)
    if not first:
        return None
    header, length, shift = bytearray(first), 0, 0
    while True:  # the remaining length: a varint of 1 to 4 bytes
        byte = (await reader.readexactly(1))[0]
        header.append(byte)
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return bytes(header) + await reader.readexactly(length)
