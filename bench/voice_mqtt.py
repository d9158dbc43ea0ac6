"""Voice proxy over MQTT: what the gateway adds to each message between a device and its server.

Run from the repository root, in the project's venv (mosquitto on PATH)::

    python bench/voice_mqtt.py [--messages N] [--json] [--timeout SECONDS]

Over MQTT the audio never passes the gateway (the server's hello names its own UDP address), so
what the proxy adds is the delay of the JSON messages (``listen``, ``hello``, MCP) on their way
device -> server -> device. Processes, all on loopback: a real mosquitto (the server's broker),
a voice server (``_voice_servers.mqtt_upstream_main``: an OTA answering an ``mqtt`` section,
and a client on ``device-server`` that publishes every message straight back to the topic it
names) and the gateway (``esp-mcp-gateway serve``, embedded broker, ``[upstream] ota_url``
naming the server). Two stock-like devices run in this process: *direct* logs in at mosquitto;
*gateway* checks in through the gateway, logs in at its broker and answers the gateway's MCP
discovery. Each sends a 200-byte ``listen`` message and times it until it is back, N per target
after a warm-up, in alternating blocks. The table gives p50/p99 of the round trip and what the
gateway adds (two passes through the proxy, each one more broker hop).

A measurement, not a test: it exits 1 only when the run itself breaks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiomqtt
import httpx2
from _processes import ChildServer, Gateway, RunBroken, free_port, start_mosquitto
from _report import add_common_arguments, run_bench, target_rows
from _voice_servers import MQTT_SERVER_TOPIC, PERCENTILES, mqtt_upstream_main, percentiles

WARMUP = 50
BLOCK = 100
DIRECT, PROXIED = "02:00:00:00:02:01", "02:00:00:00:02:02"


def _p2p(device_id: str) -> str:
    return "devices/p2p/" + device_id.replace(":", "_")


class Device:
    """A stock-like device on a broker: publishes ``listen`` and waits for it to come back."""

    def __init__(self, client: aiomqtt.Client, device_id: str, topic: str) -> None:
        self.client, self.device_id, self.topic = client, device_id, topic
        self.back: asyncio.Queue[bytes] = asyncio.Queue()

    async def read(self, up: str) -> None:
        async for message in self.client.messages:
            payload = message.payload
            assert isinstance(payload, bytes)
            data = json.loads(payload)
            if data.get("type") != "mcp":
                self.back.put_nowait(payload)
                continue
            request = data["payload"]  # the gateway's discovery: answer as stock firmware
            if "id" not in request or "method" not in request:
                continue
            result: dict[str, Any] = {"tools": []}
            if request["method"] == "initialize":
                result = {"protocolVersion": "2024-11-05", "capabilities": {},
                          "serverInfo": {"name": "bench-board", "version": "2.4.2"}}  # fmt: skip
            reply = {"jsonrpc": "2.0", "id": request["id"], "result": result}
            await self.client.publish(up, json.dumps({"type": "mcp", "payload": reply}))

    async def round_trip(self, index: int) -> float:
        message = json.dumps({"type": "listen", "state": "detect", "text": f"{index:08d}" * 16,
                              "bench_reply": _p2p(self.device_id)}).encode()  # fmt: skip
        start = time.perf_counter()
        await self.client.publish(self.topic, message)
        back = await asyncio.wait_for(self.back.get(), 10)
        elapsed = time.perf_counter() - start
        if back != message:
            raise RunBroken(f"message {index} came back changed")
        return elapsed


@contextlib.asynccontextmanager
async def device(host_port: int, login: dict[str, Any], device_id: str,
                 subscribe: str | None) -> AsyncIterator[Device]:  # fmt: skip
    client = aiomqtt.Client("127.0.0.1", host_port, username=login.get("username"),
                            password=login.get("password"),
                            identifier=login.get("client_id", f"bench-{device_id}"))  # fmt: skip
    async with client:
        if subscribe is not None:
            await client.subscribe(subscribe)
        dev = Device(client, device_id, login.get("publish_topic", MQTT_SERVER_TOPIC))
        reader = asyncio.create_task(dev.read(dev.topic))
        try:
            yield dev
        finally:
            reader.cancel()


def start_broker(workdir: Path) -> int:
    """A mosquitto on a free loopback port (the voice server's broker); its port once it listens."""
    port = free_port()
    start_mosquitto(workdir / "mosquitto.conf", ["allow_anonymous true", "persistence false"], port)
    return port


async def measure(workdir: Path, port: int, messages: int) -> dict[str, Any]:
    server = ChildServer("voice server", mqtt_upstream_main, (port,), 30)
    ota = f"http://127.0.0.1:{server.started}/xiaozhi/ota/"
    gateway = Gateway(workdir, "gateway", "bench-device-token", mqtt=True,
                      settings={"GATEWAY_UPSTREAM_OTA_URL": ota})  # fmt: skip
    try:
        headers = {"Device-Id": PROXIED, "Client-Id": "bench-client",
                   "User-Agent": "bench-board/2.4.2"}  # fmt: skip
        async with httpx2.AsyncClient(timeout=30) as http:
            reply = await http.post(gateway.ota_url, headers=headers, content=b"{}")
        if reply.status_code != 200:
            raise RunBroken(f"check-in through the gateway: HTTP {reply.status_code}")
        login = reply.json()["mqtt"]
        assert gateway.mqtt_port is not None
        samples: dict[str, list[float]] = {"direct": [], "gateway": []}
        async with device(port, {}, DIRECT, _p2p(DIRECT)) as direct, device(
            gateway.mqtt_port, login, PROXIED, None
        ) as proxied:  # fmt: skip
            await asyncio.sleep(2.0)  # the gateway's discovery and its upstream login end
            targets = {"direct": direct, "gateway": proxied}
            for dev in targets.values():
                for index in range(WARMUP):
                    await dev.round_trip(index)
            done = 0
            while done < messages:
                block = min(BLOCK, messages - done)
                for name, dev in targets.items():
                    samples[name] += [await dev.round_trip(done + i) for i in range(block)]
                done += block
        figures: dict[str, Any] = {name: percentiles(values) for name, values in samples.items()}
        figures["messages"] = messages
        for key in ("p50_ms", "p99_ms"):
            figures[f"added_{key}"] = figures["gateway"][key] - figures["direct"][key]
        gateway.check()
        figures["gateway_log"] = gateway.log_counts()
        return figures
    finally:
        gateway.close()
        server.close()


def _table(figures: dict[str, Any]) -> str:
    lines = [f"one 200-byte message's round trip device -> server -> device, "
             f"{figures['messages']} per target",
             *target_rows(figures, ("direct", "gateway"), PERCENTILES)]  # fmt: skip
    lines.append(f"{'added':<10}{figures['added_p50_ms']:>10.3f}{figures['added_p99_ms']:>10.3f}"
                 "   (gateway - direct: two more broker hops and the relay)")  # fmt: skip
    lines.append(f"gateway log: {figures['gateway_log']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, help="timed messages per target")
    add_common_arguments(parser, timeout=300.0)
    args = parser.parse_args()

    async def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="voice_mqtt-") as workdir:
            port = await asyncio.to_thread(start_broker, Path(workdir))
            return await measure(Path(workdir), port, max(args.messages, 2))

    return run_bench("voice_mqtt", args, run, _table)


if __name__ == "__main__":
    sys.exit(main())
