"""Replicas of one cluster on a real mosquitto 2, in this process (real uvicorn each)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from gateway.app import Running
from gateway.devices.registry import DeviceRegistry
from tests.conftest import bound, gateway

PREFIX = "fleet"

Check = Callable[[DeviceRegistry], bool]


def cluster_options(broker: int | Sequence[str], replica: str, **overrides: Any) -> dict[str, Any]:
    """The config of one replica: the cluster broker (a port on loopback, or the URLs of a
    cluster's nodes); MQTT devices come through it too."""
    scheme = "mqtts" if overrides.get("cluster_ca_file") else "mqtt"
    return {
        "cluster_broker": (f"{scheme}://127.0.0.1:{broker}",)
        if isinstance(broker, int)
        else tuple(broker),  # fmt: skip
        "cluster_name": PREFIX,
        "cluster_replica": replica,
        "mqtt_keepalive_interval": None,
        **overrides,
    }


@asynccontextmanager
async def replicas(
    tmp_path: Path, broker_port: int, count: int = 3, **overrides: Any
) -> AsyncIterator[list[Running]]:
    """``count`` replicas, each with its own data dir, started one after the other."""
    async with AsyncExitStack() as stack:
        runs = []
        for n in range(1, count + 1):
            options = cluster_options(broker_port, f"gw-{n}", **overrides)
            runs.append(await stack.enter_async_context(gateway(tmp_path / f"gw-{n}", **options)))
        yield runs


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
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        self._writers |= {writer, up_writer}
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()
