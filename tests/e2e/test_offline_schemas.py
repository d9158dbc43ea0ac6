"""A device's schemas are judged offline: no URL they name is fetched, the gateway never stalls.

Tool schemas name ``$schema``, ``$ref`` and ``$id`` URLs at two loopback listeners on threads of
their own (a stalled event loop cannot hide a connection from them): one answers every
connection with a JSON Schema (a fetch would succeed), one holds every connection unanswered (a
fetch would wait for its timeout). Raw devices on real WebSockets, a real gateway, an SDK client.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client

from gateway.app import Running
from tests.conftest import bound, gateway
from tests.e2e.helpers import RawDevice, aliases, serving, until
from tests.e2e.test_device_trust import check_in
from tests.e2e.test_hostile_devices import PING, PING_TOOL, listed_devices

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

JsonObject = dict[str, Any]

STOCK = "aa:bb:cc:dd:ee:ff"  # the device of test_device_trust.check_in
SCHEMA_REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n"
SCHEMA_REPLY += b'{"type":"object"}'


class Listener:
    """A loopback TCP listener on its own thread; ``connections`` counts those it accepted.

    ``answer``: each connection gets an HTTP 200 with a JSON Schema; else each is held open and
    never answered.
    """

    def __init__(self, *, answer: bool) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.connections = 0
        self._answer = answer
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name=f"listener {self.url}")

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # shut down: the test is over
                return
            self.connections += 1
            if self._answer:
                with conn:
                    conn.sendall(SCHEMA_REPLY)
            else:
                self._held.append(conn)

    @classmethod
    @contextmanager
    def pair(cls) -> Iterator[tuple[Listener, Listener]]:
        """An answering and a silent listener, both stopped on exit."""
        listeners = cls(answer=True), cls(answer=False)
        for listener in listeners:
            listener._thread.start()
        try:
            yield listeners
        finally:
            for listener in listeners:
                listener._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept()
                listener._thread.join(bound(5))
                listener._sock.close()
                for conn in listener._held:
                    conn.close()


def fetching_tools(answering: str, silent: str) -> list[JsonObject]:
    """Tools whose schemas name URLs at the two listeners, then a good tool (PING) last."""
    nothing: JsonObject = {"type": "object"}
    schemas: dict[str, tuple[JsonObject, JsonObject | None]] = {
        # the path and query an attacker picks reach the listener if it is fetched
        "meta": ({"$schema": f"{answering}/any/path?q=1", **nothing}, None),
        "stall": ({"$schema": f"{silent}/meta", **nothing}, None),
        "stall_output": (nothing, {"$schema": f"{silent}/output", **nothing}),
        "ref": ({**nothing, "properties": {"a": {"$ref": f"{answering}/ref"}}}, None),
        "stall_ref": ({**nothing, "properties": {"a": {"$ref": f"{silent}/ref"}}}, None),
        "id": ({"$id": f"{answering}/base/", **nothing, "properties": {"a": {"$ref": "a"}}}, None),
    }
    tools: list[JsonObject] = []
    for name, (schema, output) in schemas.items():
        tool: JsonObject = {"name": f"self.fetch.{name}", "inputSchema": schema}
        if output is not None:
            tool["outputSchema"] = output
        tools.append(tool)
    return [*tools, PING_TOOL]


@asynccontextmanager
async def healthy_throughout(run: Running) -> AsyncIterator[None]:
    """Ask both listeners' ``/healthz`` one after another for as long as the block runs; each
    must answer within a second (the gateway runs in this event loop: a blocked loop delays
    whichever check is waiting)."""
    urls = [f"http://127.0.0.1:{port}/healthz" for port in (run.device_port, run.host_port)]
    done = anyio.Event()

    async def check(http: httpx2.AsyncClient) -> None:
        while not done.is_set():
            for url in urls:
                with anyio.fail_after(bound(1)):
                    assert (await http.get(url)).status_code == 200

    async with httpx2.AsyncClient() as http, anyio.create_task_group() as tg:
        tg.start_soon(check, http)
        try:
            yield
        finally:
            done.set()


def assert_judged_offline(device: JsonObject, tools: list[JsonObject]) -> None:
    """Every fetching tool is rejected with its reason; PING is not."""
    reasons = {r["tool"]: r["reason"] for r in device["rejected"]}
    assert list(reasons) == [tool["name"] for tool in tools[:-1]], device
    for name in ("meta", "stall", "stall_output"):
        assert "meta-schema the gateway does not know" in reasons[f"self.fetch.{name}"]
    for name in ("ref", "stall_ref", "id"):
        assert "cannot be checked safely" in reasons[f"self.fetch.{name}"]


async def test_urls_in_schemas_are_never_fetched_and_the_other_tools_are_served(
    tmp_path: Path,
) -> None:
    """No connection reaches either listener, /healthz answers throughout, PING is served."""
    with Listener.pair() as (answering, silent):
        tools = fetching_tools(answering.url, silent.url)
        device = RawDevice("aa:bb:cc:dd:ee:30", "fetcher", tools)
        async with (
            gateway(tmp_path, devices=aliases(device)) as run,
            healthy_throughout(run),
            serving(run, device),
            Client(run.mcp_url, mode="legacy") as client,
        ):
            names = [t.name for t in (await client.list_tools()).tools]
            devices = listed_devices(await client.call_tool("list_devices", {}))
            ping = await client.call_tool(device.mcp_name(PING), {})
        assert (answering.connections, silent.connections) == (0, 0)
    assert [n for n in names if n.startswith("fetcher_")] == [device.mcp_name(PING)]
    assert not ping.is_error and device.calls == [(PING, {})]
    assert_judged_offline(devices[device.device_id], tools)
    assert [t["tool"] for t in devices[device.device_id]["tools"]] == [PING]


async def test_a_pending_stock_device_s_schemas_are_never_fetched_either(tmp_path: Path) -> None:
    """A device with no secret (an OTA check-in, then its own credential) is listed while it
    waits for approval: that listing fetches nothing and stalls nothing either."""
    with Listener.pair() as (answering, silent):
        tools = fetching_tools(answering.url, silent.url)
        async with gateway(tmp_path) as run, healthy_throughout(run):
            websocket = (await check_in(run)).json()["websocket"]
            device = RawDevice(STOCK, "pending", tools, credential=websocket["token"])
            registry = run.gateway.registry

            def listed() -> bool:
                known = registry.get(STOCK)
                return known is not None and PING in (t.spec.name for t in known.tools.values())

            async with registry.device_changes() as changes, anyio.create_task_group() as tg:
                await tg.start(device.serve, websocket["url"])
                await until(changes, listed)
                async with Client(run.mcp_url, mode="legacy") as client:
                    devices = listed_devices(await client.call_tool("list_devices", {}))
                await device.close()
        assert (answering.connections, silent.connections) == (0, 0)
    assert devices[STOCK]["state"] == "pending"
    assert_judged_offline(devices[STOCK], tools)
