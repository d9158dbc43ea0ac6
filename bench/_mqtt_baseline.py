"""The MQTT path's baseline for ``fleet.py``: mosquitto and a minimal discovery client.

What the gateway does with a stock MQTT device, done as cheaply as the well-known pieces allow:
mosquitto carries the messages, and one process (``mqtt_baseline_main``) answers the OTA
check-in with an ``mqtt`` block naming mosquitto and, as a single raw MQTT client on
``<prefix>/+/up`` (``_mqtt_device.MqttSession``, as lean as the devices), runs each device's
discovery (``initialize``, then ``tools/list`` following ``nextCursor``) as soon as the device
says hello. mosquitto cannot subscribe a device to its
``down`` topic as the embedded broker does, so the devices of this baseline subscribe themselves
and then say hello (``FleetSpec.announce``); that costs the baseline, not the gateway, a packet
each way more.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from _mqtt_device import MqttSession, connect_packet
from _processes import (
    ChildServer,
    RunBroken,
    child_main,
    cpu_s,
    free_port,
    rss_kb,
    start_mosquitto,
    until_closed,
)

__all__ = ["MqttBaseline", "mqtt_baseline_main"]

PREFIX = "bench"
_CLIENT_ID = "bench-discovery"


def _start_mosquitto(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    lines = ["allow_anonymous true", "persistence false", "log_dest none", "set_tcp_nodelay true",
             "max_queued_messages 100000"]  # fmt: skip
    return start_mosquitto(workdir / "mosquitto-baseline.conf", lines, port), port


class MqttBaseline:
    """mosquitto plus the discovery client, each in its own process."""

    def __init__(self, workdir: Path) -> None:
        self.broker, port = _start_mosquitto(workdir)
        self.client = ChildServer("MQTT baseline client", mqtt_baseline_main, (port,), 30)
        self.ota_url = f"http://127.0.0.1:{self.client.started}/xiaozhi/ota/"

    @property
    def pid(self) -> int:
        return self.client.pid

    @property
    def pids(self) -> tuple[int, int]:
        """Both processes: their CPU and memory are the baseline's."""
        return self.broker.pid, self.client.pid

    def check(self) -> None:
        self.client.check()
        if self.broker.poll() is not None:
            raise RunBroken(f"mosquitto exited ({self.broker.returncode})")

    def cpu_s(self) -> float:
        return sum(cpu_s(pid) for pid in self.pids)

    def rss_kb(self) -> int:
        return sum(rss_kb(pid) for pid in self.pids)

    def close(self) -> None:
        self.client.close()
        self.broker.terminate()
        self.broker.wait(10)


# --- the client process ------------------------------------------------------------------


async def _ota(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
    """Answer one stock check-in with an ``mqtt`` block naming mosquitto (Connection: close)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
            elif name.strip().lower() == b"device-id":
                device_id = value.strip().decode()
        await reader.readexactly(length)
        body = json.dumps({"server_time": {"timestamp": int(time.time() * 1000)}, "mqtt": {
            "endpoint": f"127.0.0.1:{port}", "client_id": device_id, "username": device_id,
            "password": "-", "publish_topic": f"{PREFIX}/{device_id}/up", "keepalive": 240,
        }}).encode()  # fmt: skip
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        writer.write(head % len(body) + b"Connection: close\r\n\r\n" + body)
        await writer.drain()
    except (OSError, ValueError, asyncio.IncompleteReadError, UnboundLocalError):
        pass
    finally:
        writer.close()


def _request(call_id: int, method: str, params: dict[str, Any]) -> str:
    payload = {"jsonrpc": "2.0", "id": call_id, "method": method, "params": params}
    return json.dumps({"session_id": "", "type": "mcp", "payload": payload})


_INIT = {"protocolVersion": "2024-11-05", "capabilities": {},
         "clientInfo": {"name": "bench-baseline", "version": "1"}}  # fmt: skip


def _discover(client: MqttSession, topic: str, data: bytes) -> None:
    """Each device's discovery, driven by what arrives on the up topics (one id at a time)."""
    device_id = topic.split("/")[1]
    try:
        parsed = json.loads(data)
    except ValueError:
        return
    if not isinstance(parsed, dict):
        return
    down = f"{PREFIX}/{device_id}/down"
    if parsed.get("type") == "hello":
        client.publish(_request(1, "initialize", _INIT), down)
        return
    payload = parsed.get("payload") if parsed.get("type") == "mcp" else None
    if not isinstance(payload, dict) or not isinstance(payload.get("id"), int):
        return
    result = payload.get("result")
    if not isinstance(result, dict):
        return
    cursor = result.get("nextCursor") if payload["id"] > 1 else ""
    if cursor is None:
        return  # the last page: this device is discovered
    params = {"cursor": cursor} if cursor else {}
    client.publish(_request(payload["id"] + 1, "tools/list", params), down)


async def _baseline(conn: Connection, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(lambda r, w: _ota(r, w, port), "127.0.0.1", 0,
                                        backlog=2048)  # fmt: skip
    # A raw client as lean as the devices (``_mqtt_device``): anonymous, on every up topic.
    login = connect_packet(_CLIENT_ID, None, None, 0)
    client = MqttSession(login, "", 0, _discover, subscribe=f"{PREFIX}/+/up")
    async with server:
        await loop.create_connection(lambda: client, "127.0.0.1", port)
        if await client.connected:
            raise RuntimeError("mosquitto refused the discovery client")
        conn.send(server.sockets[0].getsockname()[1])
        await until_closed(conn)
        client.abort()


def mqtt_baseline_main(conn: Connection, port: int) -> None:
    """Entry point of the discovery client's process: sends its OTA port, serves until told."""
    child_main(_baseline(conn, port))
