"""The processes behind ``fleet.py``: lean stock-like devices, and the bare baseline server.

A *worker* (``worker_main``) is one process with one asyncio loop holding many devices, each a
plain ``websockets`` client (or an OTA check-in plus a raw-socket MQTT session,
``_mqtt_device``) that behaves like stock xiaozhi firmware on the wire (docs/protocol.md §1-§4)
and nothing more: no firmware
code, pre-serialised replies (``_fleet_catalogue``), so thousands fit in a few processes. The
orchestrator drives workers over a ``multiprocessing`` pipe, one request and one reply at a
time: ``start`` a named group of devices, ``wait`` for it, fetch its ``results``, ``stop`` it.

The *baseline* (``baseline_main``) is a bare ``websockets`` server doing the gateway's device
handshake and nothing else: server hello, ``initialize``, ``tools/list`` following nextCursor.

Times are ``time.monotonic()``, which is one clock for every process on Linux, so the
orchestrator compares them with its own start time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from _fleet_catalogue import CALL_RESULT, INIT_RESULT, page_for
from _mqtt_device import MqttSession, check_in, connect_packet
from _processes import child_main, until_closed
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, WebSocketException
from websockets.http11 import Request, Response

__all__ = ["FleetSpec", "Outcome", "baseline_main", "serve_devices", "worker_main"]

JsonObject = dict[str, Any]
Outcome = tuple[float | None, float | None, str | None, float | None, float | None]
"""Per device: when it answered its last tools/list page, when the server first answered
(WebSocket: the server hello; MQTT: the OTA reply), why it failed (None if it did not), when
it was connected (WebSocket: the handshake done; MQTT: its CONNACK) and when the server's
first MCP request reached it (the storm's timeline)."""

DEVICE_HELLO = json.dumps(
    {
        "type": "hello",
        "version": 1,
        "features": {"mcp": True},
        "transport": "websocket",
        "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1,
                         "frame_duration": 60},
    },
    separators=(",", ":"),
)  # fmt: skip
STOCK_HELLO_WAIT = 10.0  # s: stock firmware gives up on the server hello after this (§1)
PING_INTERVAL = 20.0  # s: the gateway's WebSocket ping interval; the baseline pings alike
BACKLOG = 2048  # uvicorn's default, which the gateway's listening sockets end up with


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """A group of devices for one worker: who they are, where they go, how patient they are."""

    kind: str  # "ws" (connect to url) or "mqtt" (OTA check-in at url, then the broker)
    url: str
    token: str
    ids: tuple[str, ...] = ()
    start_at: float = 0.0  # monotonic time at which every device of the group starts at once
    open_timeout: float = 10.0  # s: WebSocket/MQTT connect (stock: 10 s handshake timeout)
    hello_timeout: float | None = STOCK_HELLO_WAIT  # None: wait for the server hello forever
    max_inflight: int | None = None  # joins in progress at once; None: all at once (a storm)
    # MQTT: subscribe to the own down topic and say hello once connected (a broker that does
    # not subscribe devices itself, a server that learns of a device from its hello)
    announce: bool = False
    # MQTT: the broker (host:port) to connect to instead of the OTA reply's endpoint: a fleet
    # spread over leaf brokers, where the reply can name only one (``_fleet_brokers``)
    broker: str | None = None


# --- the device side of MCP (docs/protocol.md §4) -------------------------------------------


def mcp_reply(payload: object, session: str) -> tuple[str | None, bool]:
    """The envelope answering one JSON-RPC request, and whether it carries the last page.

    Like stock firmware: notifications and requests without a numeric id get no answer,
    unknown methods an error without ``code``.
    """
    if not isinstance(payload, dict):
        return None, False
    method, call_id = payload.get("method"), payload.get("id")
    if not isinstance(method, str) or method.startswith("notifications"):
        return None, False
    if not isinstance(call_id, int) or isinstance(call_id, bool):
        return None, False
    last = False
    if method == "initialize":
        body = f'"result":{INIT_RESULT}'
    elif method == "tools/list":
        params = payload.get("params")
        cursor = params.get("cursor", "") if isinstance(params, dict) else ""
        page = page_for(cursor if isinstance(cursor, str) else "")
        if page is None:  # stock's message for an unknown cursor, with the empty name
            body = '"error":{"message":"Failed to add tool  because of payload size limit"}'
        else:
            body, last = f'"result":{page[0]}', page[1]
    elif method == "tools/call":
        body = f'"result":{CALL_RESULT}'
    else:
        body = f'"error":{{"message":"Method not implemented: {method}"}}'
    envelope = (
        f'{{"session_id":"{session}","type":"mcp","payload":{{"jsonrpc":"2.0","id":{call_id},'
    )
    return envelope + body + "}}", last


def _parse(text: str | bytes) -> JsonObject:
    try:
        message = json.loads(text)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


# --- one group of devices ----------------------------------------------------------------


@dataclass(slots=True)
class Device:
    """One emulated device and what happened to it."""

    device_id: str
    client_id: str
    listed_at: float | None = None
    first_at: float | None = None
    failure: str | None = None
    connected_at: float | None = None
    asked_at: float | None = None
    abort: Callable[[], None] | None = None  # drops the connection at once (no close frame)
    holds_slot: bool = False


@dataclass(slots=True)
class Group:
    """Devices started together; ``settled`` counts those listed or failed."""

    spec: FleetSpec
    devices: list[Device]
    limit: asyncio.Semaphore | None
    settled: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def listed(self, device: Device) -> None:
        if device.listed_at is None and device.failure is None:
            device.listed_at = time.monotonic()
            self._settle(device)

    def fail(self, device: Device, reason: str) -> None:
        if device.listed_at is None and device.failure is None:
            device.failure = reason
            self._settle(device)

    def _settle(self, device: Device) -> None:
        if device.holds_slot and self.limit is not None:
            device.holds_slot = False
            self.limit.release()
        self.settled += 1
        if self.settled == len(self.devices):
            self.done.set()

    def counts(self) -> tuple[int, int, int]:
        listed = sum(d.listed_at is not None for d in self.devices)
        return listed, self.settled - listed, len(self.devices)


async def _ws_device(group: Group, device: Device) -> None:
    """A stock device over WebSocket: connect, hello, answer MCP until the socket goes."""
    spec = group.spec
    headers = {
        "Authorization": f"Bearer {spec.token}",
        "Protocol-Version": "1",
        "Device-Id": device.device_id,
        "Client-Id": device.client_id,
    }
    try:
        # No compression (stock firmware offers none), no pings (devices answer, never send).
        ws = await connect(spec.url, additional_headers=headers, user_agent_header=None,
                           compression=None, proxy=None, open_timeout=spec.open_timeout,
                           ping_interval=None, close_timeout=1)  # fmt: skip
    except (OSError, TimeoutError, WebSocketException):
        group.fail(device, "connect")
        return
    device.abort = ws.transport.abort
    device.connected_at = time.monotonic()
    try:
        await ws.send(DEVICE_HELLO)
        session = ""
        async with asyncio.timeout(spec.hello_timeout) as waiting:
            async for text in ws:
                message = _parse(text)
                if message.get("type") == "hello" and device.first_at is None:
                    device.first_at = time.monotonic()
                    session = str(message.get("session_id") or "")
                    waiting.reschedule(None)
                elif message.get("type") == "mcp":
                    if device.asked_at is None:
                        device.asked_at = time.monotonic()
                    reply, last = mcp_reply(message.get("payload"), session)
                    if reply is not None:
                        await ws.send(reply)
                    if last:
                        group.listed(device)
        group.fail(device, "closed")
    except TimeoutError:  # stock firmware gives up and drops the socket
        group.fail(device, "hello_timeout")
    except ConnectionClosed:
        group.fail(device, "closed")
    finally:
        ws.transport.abort()


async def _mqtt_device(group: Group, device: Device) -> None:
    """A stock device over MQTT: OTA check-in, then the broker with the issued login."""
    spec = group.spec
    try:
        async with asyncio.timeout(30):  # esp_http_client's timeout (§3)
            mqtt = await check_in(spec.url, device.device_id, device.client_id)
        host, _, port = (spec.broker or str(mqtt["endpoint"])).rpartition(":")
        login = connect_packet(str(mqtt["client_id"]), str(mqtt["username"]),
                               str(mqtt["password"]), int(mqtt.get("keepalive", 240)))  # fmt: skip
        topic = str(mqtt["publish_topic"])
    except (OSError, TimeoutError, ValueError, KeyError, IndexError):
        group.fail(device, "ota")
        return

    def answer(session: MqttSession, topic: str, payload: bytes) -> None:
        parsed = _parse(payload)
        if parsed.get("type") != "mcp":
            return  # no hello over MQTT unless a conversation starts
        if device.asked_at is None:
            device.asked_at = time.monotonic()
        reply, last = mcp_reply(parsed.get("payload"), "")
        if reply is not None:
            session.publish(reply)
        if last:
            group.listed(device)

    device.first_at = time.monotonic()
    # Stock firmware never subscribes: the broker pushes the down topic (§2). A broker that
    # does not (``announce``) is asked for it, and the device says hello once subscribed.
    loop = asyncio.get_running_loop()
    down = topic.rpartition("/")[0] + "/down" if spec.announce else None
    session = MqttSession(login, topic, int(mqtt.get("keepalive", 240)), answer, down,
                          spec.announce)  # fmt: skip
    device.abort = session.abort
    try:
        async with asyncio.timeout(spec.open_timeout):  # TCP and CONNACK, as aiomqtt's timeout
            await loop.create_connection(lambda: session, host, int(port))
            code = await session.connected
    except (OSError, TimeoutError, ValueError):
        session.abort()
        group.fail(device, "mqtt_connect")
        return
    if code:
        group.fail(device, "mqtt_connect")
        return
    device.connected_at = time.monotonic()
    await session.lost
    group.fail(device, "closed")


async def _run_device(group: Group, device: Device) -> None:
    if group.limit is not None:
        await group.limit.acquire()
        device.holds_slot = True
    try:
        if group.spec.kind == "mqtt":
            await _mqtt_device(group, device)
        else:
            await _ws_device(group, device)
    finally:
        group.fail(device, "closed")  # no-op unless it ended before being listed


# --- the worker process ------------------------------------------------------------------


class Worker:
    """Groups of devices in this process, driven by requests from the orchestrator."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}

    async def handle(self, op: str, name: str, arg: Any) -> Any:
        """Carry out one request; return the reply."""
        if op == "ready":  # imported and serving
            return None
        if op == "start":
            return self._start(name, arg)
        group = self.groups[name]
        if op == "wait":
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(arg):
                    await group.done.wait()
            return group.counts()
        if op == "results":
            return [(d.listed_at, d.first_at, d.failure, d.connected_at, d.asked_at)
                    for d in group.devices]  # fmt: skip
        if op == "stop":
            await self._stop(self.groups.pop(name))
            return None
        raise ValueError(f"unknown request {op!r}")

    def _start(self, name: str, spec: FleetSpec) -> int:
        if name in self.groups:
            raise ValueError(f"group {name!r} is already running")
        devices = [Device(device_id, _client_id(device_id)) for device_id in spec.ids]
        limit = asyncio.Semaphore(spec.max_inflight) if spec.max_inflight else None
        group = Group(spec, devices, limit)
        if not devices:
            group.done.set()
        self.groups[name] = group

        async def launch() -> None:
            await asyncio.sleep(max(0.0, spec.start_at - time.monotonic()))
            for device in devices:  # all at once: each task starts connecting on its first step
                group.tasks.append(asyncio.create_task(_run_device(group, device)))

        group.tasks.append(asyncio.create_task(launch()))
        return len(devices)

    async def _stop(self, group: Group) -> None:
        for device in group.devices:
            if device.abort is not None:
                device.abort()
        for _ in range(5):  # cancel again: a task may swallow a cancellation (Python 3.11)
            pending = [task for task in group.tasks if not task.done()]
            if not pending:
                return
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=1.0)


def _client_id(device_id: str) -> str:
    """A stable UUIDv4-shaped client id per device (stock keeps one in NVS)."""
    digits = device_id.replace(":", "").rjust(12, "0")
    return f"5b3f4c1e-0000-4000-8000-{digits}"


async def _serve_requests(conn: Connection) -> None:
    worker = Worker()
    loop = asyncio.get_running_loop()
    while True:
        try:
            op, name, arg = await loop.run_in_executor(None, conn.recv)
        except EOFError:  # the orchestrator is gone
            return
        if op == "exit":
            return
        try:
            reply: Any = ("ok", await worker.handle(op, name, arg))
        except Exception as exc:  # report it; the orchestrator decides
            reply = ("error", f"{type(exc).__name__}: {exc}")
        conn.send(reply)


def worker_main(conn: Connection) -> None:
    """Entry point of a worker process."""
    child_main(_serve_requests(conn))


# --- the baseline server -----------------------------------------------------------------


async def _baseline_request(ws: ServerConnection, session: str, call_id: int, method: str,
                            params: JsonObject) -> JsonObject:  # fmt: skip
    request = {"jsonrpc": "2.0", "id": call_id, "method": method, "params": params}
    await ws.send(json.dumps({"session_id": session, "type": "mcp", "payload": request}))
    while True:  # the answer, by id (stock replies may come out of order)
        payload = _parse(await ws.recv()).get("payload")
        if isinstance(payload, dict) and payload.get("id") == call_id:
            result = payload.get("result")
            if not isinstance(result, dict):
                raise ValueError(f"{method} failed: {payload.get('error')}")
            return result


async def _baseline_session(ws: ServerConnection) -> None:
    """What the gateway does with a device, minus everything else."""
    try:
        async with asyncio.timeout(STOCK_HELLO_WAIT):
            while _parse(await ws.recv()).get("type") != "hello":
                pass
        session = secrets.token_hex(8)
        await ws.send(json.dumps({
            "type": "hello", "transport": "websocket", "session_id": session,
            "audio_params": {"format": "opus", "sample_rate": 24000, "channels": 1,
                             "frame_duration": 60},
        }))  # fmt: skip
        init = {"protocolVersion": "2024-11-05", "capabilities": {},
                "clientInfo": {"name": "bench-baseline", "version": "1"}}  # fmt: skip
        await _baseline_request(ws, session, 1, "initialize", init)
        tools: list[JsonObject] = []
        cursor, call_id = "", 2
        while True:
            params = {"cursor": cursor} if cursor else {}
            page = await _baseline_request(ws, session, call_id, "tools/list", params)
            tools += page.get("tools", [])
            cursor, call_id = str(page.get("nextCursor") or ""), call_id + 1
            if not cursor:
                break
        await ws.wait_closed()  # the device stays, idle
    except (ConnectionClosed, TimeoutError, ValueError):
        pass


def _baseline_admit(token: str) -> Callable[[ServerConnection, Request], Response | None]:
    def admit(ws: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Authorization") != f"Bearer {token}":
            return ws.respond(403, "missing or invalid device token\n")
        return None

    return admit


async def serve_devices(
    conn: Connection, token: str, session: Callable[[ServerConnection], Awaitable[None]]
) -> None:
    """A bare ``websockets`` server for stock devices, ``session`` for each (the token checked,
    pings and backlog as the gateway's): its port sent through ``conn``, serving until it closes."""
    async with serve(session, "127.0.0.1", 0, compression=None,
                     process_request=_baseline_admit(token), ping_interval=PING_INTERVAL,
                     server_header=None, backlog=BACKLOG) as server:  # fmt: skip
        conn.send(next(iter(server.sockets)).getsockname()[1])
        await until_closed(conn)


def baseline_main(conn: Connection, token: str) -> None:
    """Entry point of the baseline server process: sends its port, serves until told to stop."""
    child_main(serve_devices(conn, token, _baseline_session))
