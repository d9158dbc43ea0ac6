"""Voice proxy: what the gateway adds to each audio frame, and what 100 conversations cost it.

Run from the repository root, in the project's venv::

    python bench/voice_proxy.py [--frames N] [--conversations C] [--seconds S] [--json]
                                [--timeout SECONDS]

Processes, all on loopback: a voice server (``_voice_servers.upstream_main``: OTA, and a
WebSocket that answers the hello and sends every binary frame straight back), the gateway
(``esp-mcp-gateway serve`` with ``[upstream] ota_url`` naming that server), and a bare relay
(``_voice_servers.relay_main``: a ``websockets`` server that copies frames both ways and does
nothing else). The devices run in this process: stock-like WebSocket clients that check in
(through the gateway, or at the server for the others), say hello, answer the gateway's MCP
discovery, and send 120-byte binary frames (a 60 ms Opus frame).

* **latency**: one conversation per target, *direct* (device to server), *relay* and
  *gateway*; a frame is sent and timed until its echo is back (``time.perf_counter()``), N
  frames per target after a warm-up, in alternating blocks so that load hits all alike. The
  table gives p50 and p99 of the round trip, and what the gateway adds to them over the direct
  connection: two passes through the proxy (device to server and back). The goal is at most
  2 ms added at p99. On a loaded machine the p99 of every target moves by milliseconds from
  run to run; the bare relay's p99 says how much of that any relay process would add.
* **cpu**: C conversations at once through the relay, then through the gateway, each sending a
  frame every 60 ms for S seconds (and hearing it back): the CPU time of the relaying process
  over those seconds (``/proc/<pid>/task/*/schedstat``), in % of one core, and the ratio
  gateway/relay. The voice server's and the devices' CPU are not counted.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from _processes import ChildServer, Gateway, RunBroken, threads_cpu_s
from _report import add_common_arguments, run_bench, target_rows
from _voice_servers import PERCENTILES, UPSTREAM_TOKEN, percentiles, relay_main, upstream_main
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

FRAME_BYTES = 120
FRAME_INTERVAL = 0.06  # seconds: one Opus frame of 60 ms
WARMUP = 50
BLOCK = 100
HELLO = {"type": "hello", "version": 1, "features": {"mcp": True}, "transport": "websocket",
         "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1,
                          "frame_duration": 60}}  # fmt: skip
TOOL = {"name": "self.lamp.turn_on", "description": "Turn the lamp on.",
        "inputSchema": {"type": "object", "properties": {}}}  # fmt: skip


@dataclass
class Talk:
    """One device conversation: its socket and the frames that came back."""

    ws: ClientConnection
    echoes: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    reader: asyncio.Task[None] | None = None


async def _read(talk: Talk) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for frame in talk.ws:
            if isinstance(frame, bytes):
                talk.echoes.put_nowait(frame)
                continue
            message = json.loads(frame)
            payload = message.get("payload") or {}
            if message.get("type") != "mcp" or "method" not in payload or "id" not in payload:
                continue
            result: dict[str, Any] = {"tools": [TOOL]}  # tools/list; initialize takes anything
            if payload["method"] == "initialize":
                result = {"protocolVersion": "2024-11-05", "capabilities": {},
                          "serverInfo": {"name": "bench-board", "version": "2.4.2"}}  # fmt: skip
            reply = {"jsonrpc": "2.0", "id": payload["id"], "result": result}
            await talk.ws.send(json.dumps({"session_id": "", "type": "mcp", "payload": reply}))


@contextlib.asynccontextmanager
async def conversation(url: str, token: str, device_id: str) -> AsyncIterator[Talk]:
    """A stock-like conversation: connect, hello, wait for the server's hello."""
    headers = {"Authorization": f"Bearer {token}", "Protocol-Version": "1",
               "Device-Id": device_id, "Client-Id": f"bench-{device_id}"}  # fmt: skip
    async with connect(url, additional_headers=headers, compression=None, proxy=None,
                       open_timeout=30) as ws:  # fmt: skip
        await ws.send(json.dumps(HELLO))
        async with asyncio.timeout(30):
            while json.loads(await ws.recv()).get("type") != "hello":
                pass
        talk = Talk(ws)
        talk.reader = asyncio.create_task(_read(talk))
        try:
            yield talk
        finally:
            await ws.close()
            talk.reader.cancel()


async def check_in(http: httpx2.AsyncClient, ota_url: str, device_id: str) -> dict[str, Any]:
    """The device's OTA check-in; the ``websocket`` section of the reply."""
    headers = {"Device-Id": device_id, "Client-Id": f"bench-{device_id}",
               "User-Agent": "bench-board/2.4.2", "Content-Type": "application/json"}  # fmt: skip
    response = await http.post(ota_url, headers=headers, content=b"{}")
    if response.status_code != 200:
        raise RunBroken(f"check-in at {ota_url}: HTTP {response.status_code} {response.text}")
    websocket: dict[str, Any] = response.json()["websocket"]
    return websocket


async def round_trip(talk: Talk, index: int) -> float:
    """Send one frame; seconds until it is back."""
    frame = index.to_bytes(4, "big") + bytes(FRAME_BYTES - 4)
    start = time.perf_counter()
    await talk.ws.send(frame)
    echo = await asyncio.wait_for(talk.echoes.get(), 10)
    elapsed = time.perf_counter() - start
    if echo != frame:
        raise RunBroken(f"frame {index} came back changed")
    return elapsed


async def latency(targets: dict[str, tuple[str, str]], frames: int) -> dict[str, Any]:
    """Round trips per target, in alternating blocks."""
    samples: dict[str, list[float]] = {name: [] for name in targets}
    async with contextlib.AsyncExitStack() as stack:
        device = "02:00:00:00:01:00"
        talks = {name: await stack.enter_async_context(conversation(url, token, device))
                 for name, (url, token) in targets.items()}  # fmt: skip
        await asyncio.sleep(1.0)  # the gateway's discovery of the device ends before timing
        for talk in talks.values():
            for index in range(WARMUP):
                await round_trip(talk, index)
        done = 0
        while done < frames:
            block = min(BLOCK, frames - done)
            for name, talk in talks.items():
                samples[name] += [await round_trip(talk, done + i) for i in range(block)]
            done += block
    figures: dict[str, Any] = {name: percentiles(values) for name, values in samples.items()}
    figures["frames"] = frames
    for key in ("p50_ms", "p99_ms"):
        figures[f"added_{key}"] = figures["gateway"][key] - figures["direct"][key]
        figures[f"over_relay_{key}"] = figures["gateway"][key] - figures["relay"][key]
    return figures


def process_cpu_s(pid: int) -> float:
    """CPU seconds of the live threads of ``pid`` (nanosecond schedstat)."""
    seconds = threads_cpu_s(pid)
    if seconds is None:
        raise RunBroken(f"no /proc/{pid}/task/*/schedstat on this kernel")
    return seconds


async def _stream(talk: Talk, until: float) -> int:
    sent = 0
    while time.monotonic() < until:
        await talk.ws.send(bytes(FRAME_BYTES))
        sent += 1
        await asyncio.sleep(FRAME_INTERVAL)
    return sent


async def cpu(url: str, tokens: list[str], ids: list[str], pid: int, seconds: float) -> float:
    """% of one core the relaying process ``pid`` used while the conversations streamed."""
    async with contextlib.AsyncExitStack() as stack:
        talks = [await stack.enter_async_context(conversation(url, token, device_id))
                 for token, device_id in zip(tokens, ids, strict=True)]  # fmt: skip
        await asyncio.sleep(2.0)  # discoveries done
        start_cpu, start = process_cpu_s(pid), time.monotonic()
        sent = await asyncio.gather(*(_stream(talk, start + seconds) for talk in talks))
        used, wall = process_cpu_s(pid) - start_cpu, time.monotonic() - start
        for talk, count in zip(talks, sent, strict=True):  # every frame came back
            for _ in range(count):
                await asyncio.wait_for(talk.echoes.get(), 10)
    return 100 * used / wall


async def measure(workdir: Path, frames: int, conversations: int, seconds: float) -> dict[str, Any]:
    upstream = ChildServer("voice server", upstream_main, (), 30)
    upstream_ota = f"http://127.0.0.1:{upstream.started}/xiaozhi/ota/"
    upstream_ws = f"ws://127.0.0.1:{upstream.started}/xiaozhi/v1/"
    relay = ChildServer("bare relay", relay_main, (upstream_ws,), 30)
    relay_ws = f"ws://127.0.0.1:{relay.started}/xiaozhi/v1/"
    gateway = Gateway(workdir, "gateway", "bench-device-token", mqtt=False,
                      settings={"GATEWAY_UPSTREAM_OTA_URL": upstream_ota})  # fmt: skip
    try:
        ids = [f"02:00:00:00:{n // 256:02x}:{n % 256:02x}" for n in range(conversations)]
        async with httpx2.AsyncClient(timeout=30) as http:
            own = [await check_in(http, gateway.ota_url, i) for i in [*ids, "02:00:00:00:01:00"]]
        figures = {
            "latency": await latency(
                {
                    "direct": (upstream_ws, UPSTREAM_TOKEN),
                    "relay": (relay_ws, UPSTREAM_TOKEN),
                    "gateway": (own[-1]["url"], own[-1]["token"]),
                },
                frames,
            ),  # fmt: skip
            "cpu": {"conversations": conversations, "seconds": seconds},
        }
        relay_pct = await cpu(relay_ws, [UPSTREAM_TOKEN] * conversations, ids, relay.pid, seconds)
        gateway_pct = await cpu(own[0]["url"], [o["token"] for o in own[:-1]], ids,
                                gateway.pid, seconds)  # fmt: skip
        figures["cpu"] |= {"relay_core_pct": relay_pct, "gateway_core_pct": gateway_pct,
                           "ratio": gateway_pct / relay_pct if relay_pct else None}  # fmt: skip
        gateway.check()
        figures["gateway_log"] = gateway.log_counts()
        return figures
    finally:
        gateway.close()
        relay.close()
        upstream.close()


def _table(figures: dict[str, Any]) -> str:
    lat, load = figures["latency"], figures["cpu"]
    lines = [f"latency: one frame's round trip, {lat['frames']} frames per target",
             *target_rows(lat, ("direct", "relay", "gateway"), PERCENTILES)]  # fmt: skip
    lines.append(f"{'added':<10}{lat['added_p50_ms']:>10.3f}{lat['added_p99_ms']:>10.3f}"
                 "   (gateway - direct; goal p99 <= 2 ms)")  # fmt: skip
    lines.append(f"{'vs relay':<10}{lat['over_relay_p50_ms']:>10.3f}"
                 f"{lat['over_relay_p99_ms']:>10.3f}   (gateway - bare relay)")  # fmt: skip
    ratio = load["ratio"]
    lines += [f"cpu: {load['conversations']} conversations for {load['seconds']:g} s, "
              f"% of one core: relay {load['relay_core_pct']:.1f}, gateway "
              f"{load['gateway_core_pct']:.1f}, ratio "
              f"{ratio:.2f}" if ratio else "n/a"]  # fmt: skip
    lines.append(f"gateway log: {figures['gateway_log']}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2000, help="timed frames per target")
    parser.add_argument("--conversations", type=int, default=100, help="conversations at once")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long they stream")
    add_common_arguments(parser, timeout=300.0)
    args = parser.parse_args()

    async def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="voice_proxy-") as workdir:
            frames = max(args.frames, 2)
            return await measure(Path(workdir), frames, args.conversations, args.seconds)

    return run_bench("voice_proxy", args, run, _table)


if __name__ == "__main__":
    sys.exit(main())
