"""The processes of ``voice_proxy.py`` besides the gateway: a voice server and a bare relay.

* ``upstream_main``: a voice server as stock devices know it (uvicorn, Starlette): ``POST
  /xiaozhi/ota/`` answers ``websocket{url, token}``; ``/xiaozhi/v1/`` answers the hello and
  sends every binary frame straight back (the "audio" a device hears is what it said).
* ``relay_main``: the simplest relay there is, the CPU baseline: a ``websockets`` server that
  opens the same upstream WebSocket for each device (with the device's headers) and copies
  frames both ways, nothing else.

* ``mqtt_upstream_main``: the MQTT side of a voice server (``voice_mqtt.py``): an OTA answering
  an ``mqtt`` section that names a broker, and a client on ``device-server`` of that broker that
  publishes every message straight back to the topic the message names (``bench_reply``).

Each sends its port through the pipe once it listens and serves until the pipe closes.
``percentiles`` is the voice benchmarks' shared figure, ``PERCENTILES`` its table's columns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import statistics
from multiprocessing.connection import Connection

import aiomqtt
import uvicorn
from _processes import child_main, until_closed
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

UPSTREAM_TOKEN = "bench-upstream-token"
MQTT_SERVER_TOPIC = "device-server"
_RELAYED = ("Authorization", "Device-Id", "Client-Id", "Protocol-Version")


async def _upstream(conn: Connection) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]

    async def ota(request: Request) -> JSONResponse:
        url = f"ws://127.0.0.1:{port}/xiaozhi/v1/"
        return JSONResponse({"server_time": {"timestamp": 0, "timezone_offset": 0},
                             "websocket": {"url": url, "token": UPSTREAM_TOKEN}})  # fmt: skip

    async def voice(websocket: WebSocket) -> None:
        if websocket.headers.get("authorization") != f"Bearer {UPSTREAM_TOKEN}":
            await websocket.close(code=1008)
            return
        await websocket.accept()
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("bytes") is not None:
                    await websocket.send_bytes(message["bytes"])
                elif '"hello"' in (message.get("text") or ""):
                    hello = {"type": "hello", "transport": "websocket", "session_id": "bench"}
                    await websocket.send_text(json.dumps(hello))
        except (WebSocketDisconnect, RuntimeError):
            return

    app = Starlette(routes=[Route("/xiaozhi/ota/", ota, methods=["POST"]),
                            WebSocketRoute("/xiaozhi/v1/", voice)])  # fmt: skip
    config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning",
                            ws="websockets-sansio", backlog=1024)  # fmt: skip
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    conn.send(port)  # bound and listening already: early connections wait in the backlog
    await until_closed(conn)
    server.should_exit = True
    await serving


async def _pump(source: ServerConnection | ClientConnection,
                sink: ServerConnection | ClientConnection) -> None:  # fmt: skip
    with contextlib.suppress(ConnectionClosed):
        async for frame in source:
            await sink.send(frame)


async def _relay(conn: Connection, upstream_url: str) -> None:
    async def session(device: ServerConnection) -> None:
        assert device.request is not None
        headers = {name: device.request.headers[name] for name in _RELAYED
                   if name in device.request.headers}  # fmt: skip
        async with connect(upstream_url, additional_headers=headers, compression=None,
                           proxy=None) as upstream:  # fmt: skip
            pumps = [asyncio.create_task(_pump(device, upstream)),
                     asyncio.create_task(_pump(upstream, device))]  # fmt: skip
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for pump in pumps:
                pump.cancel()

    async with serve(session, "127.0.0.1", 0, compression=None, backlog=1024) as server:
        conn.send(next(iter(server.sockets)).getsockname()[1])
        await until_closed(conn)


def upstream_main(conn: Connection) -> None:
    """Entry point of the voice server process."""
    child_main(_upstream(conn))


def relay_main(conn: Connection, upstream_url: str) -> None:
    """Entry point of the bare relay process."""
    child_main(_relay(conn, upstream_url))


def _p2p(device_id: str) -> str:
    return "devices/p2p/" + device_id.replace(":", "_")


async def _mqtt_upstream(conn: Connection, broker_port: int) -> None:
    async def ota(request: Request) -> JSONResponse:
        device_id = request.headers.get("device-id", "")
        mqtt = {"endpoint": f"127.0.0.1:{broker_port}", "client_id": f"GID_bench@@@{device_id}",
                "username": "bench", "password": "bench", "publish_topic": MQTT_SERVER_TOPIC,
                "subscribe_topic": _p2p(device_id)}  # fmt: skip
        return JSONResponse({"server_time": {"timestamp": 0, "timezone_offset": 0}, "mqtt": mqtt})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    app = Starlette(routes=[Route("/xiaozhi/ota/", ota, methods=["POST"])])
    config = uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning")
    serving = asyncio.create_task(uvicorn.Server(config).serve(sockets=[sock]))
    async with aiomqtt.Client("127.0.0.1", broker_port, identifier="bench-server") as client:
        await client.subscribe(MQTT_SERVER_TOPIC)
        conn.send(sock.getsockname()[1])  # listening already: a check-in waits in the backlog
        async for message in client.messages:  # every message straight back where it says
            payload = message.payload
            assert isinstance(payload, bytes)
            await client.publish(json.loads(payload)["bench_reply"], payload)
    serving.cancel()


def mqtt_upstream_main(conn: Connection, broker_port: int) -> None:
    """Entry point of the MQTT voice server process."""
    child_main(_mqtt_upstream(conn, broker_port))


PERCENTILES = [("p50 ms", "p50_ms", 10, ".3f"), ("p99 ms", "p99_ms", 10, ".3f")]  # their columns


def percentiles(samples: list[float]) -> dict[str, float]:
    """p50 and p99 of ``samples`` (seconds), in milliseconds."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": statistics.median(ordered) * 1000, "p99_ms": p99 * 1000}
