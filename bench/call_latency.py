"""Tool-call latency: an MCP client through the gateway to a device, against a bare SDK server.

Run from the repository root, in the project's venv::

    python bench/call_latency.py [--calls N] [--json] [--timeout SECONDS] [--device MODE]

Two targets, served in this process and event loop, called by the same client code
(``mcp.Client(url, mode="legacy")``, streamable HTTP, one stateful session per target):

* ``baseline``: a bare low-level SDK ``Server`` whose one tool answers at once, on uvicorn.
* ``gateway``: the real gateway (``gateway.app.running``) with one device connected over
  WebSocket; the call is ``sim-esp32_0001_lamp_get_state``, a tool the device answers at once.
  The device is, as ``--device`` says, ``process`` (the default): the lean device of
  ``_call_device.py`` in a process of its own, as a real device is another machine, so its
  work and caches are not the gateway's; or ``simulator``: a ``SimulatedDevice`` (the
  firmware's code) in this process and loop.

A third, ``hop``, is the device hop alone: the same tool called through the gateway's
connection to the device (``DeviceConnection.call``: its protocol, the WebSocket both ways and
the device), with no MCP, HTTP, routing or audit; the baseline has no such hop at all. A
fourth, ``mcp``, is the gateway's host side alone: the same MCP call with the device's
connection answering at once (what the lamp answers), so everything but the device hop: the
listener's guards, the SDK server, routing, policy, the deadline, audit and metrics.

After a warm-up, N sequential calls per target are timed with ``time.perf_counter()``, in
alternating blocks so machine noise hits all alike. The table gives the median and p99 in
milliseconds, this process's CPU time per call (``time.process_time()``, the client's
included, a device process's not), the ratios gateway/baseline and what the gateway adds per
call, with and without its device hop. A ratio of 1.0 would mean the gateway and its device
WebSocket hop cost nothing beyond the SDK's own per-call cost. It is a measurement, not a
test: it exits 0 (errors go to stderr, exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import mcp.types as types
import uvicorn
from _baseline import baseline_config
from _report import add_common_arguments, run_bench, target_rows
from mcp import Client
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Route

from gateway.app import running
from gateway.cli import heap
from gateway.config import Config, ListenAddress
from gateway.net.listeners import bind
from gateway.simulator import SimulatedDevice

WARMUP = 50  # calls per target before timing
BLOCK = 50  # calls per target per round; rounds alternate which target goes first
DEVICE_TOKEN = "bench-device-token"
DEVICE_ID = "02:00:00:00:00:01"
GATEWAY_TOOL = "sim-esp32_0001_lamp_get_state"
BASELINE_TOOL = "get_state"
LAMP_STATE = '{"power":false}'  # what the simulated lamp answers, so both replies weigh the same
LOOPBACK = ListenAddress("127.0.0.1", 0)


def _baseline_server() -> Server:
    """A low-level SDK server with one tool that answers what the simulated lamp answers."""
    tool = types.Tool(name=BASELINE_TOOL, input_schema={"type": "object", "properties": {}})

    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(
        ctx: ServerRequestContext, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=LAMP_STATE)])

    return Server("bench-baseline", on_list_tools=list_tools, on_call_tool=call_tool)


@contextlib.asynccontextmanager
async def baseline() -> AsyncIterator[str]:
    """Serve the bare SDK server over stateful streamable HTTP; yield its MCP URL."""
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    manager = StreamableHTTPSessionManager(app=_baseline_server(), security_settings=security)
    app = Starlette(routes=[Route("/mcp", endpoint=StreamableHTTPASGIApp(manager))])
    config = baseline_config(app)
    server, sock = uvicorn.Server(config), bind(LOOPBACK)
    async with manager.run():
        task = asyncio.create_task(server.serve(sockets=[sock]), name="bench.baseline")
        try:
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("the baseline server stopped while starting")
                await asyncio.sleep(0.01)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
        finally:
            server.should_exit = True
            await asyncio.gather(task, return_exceptions=True)
            sock.close()


Target = Callable[[], Awaitable[None]]  # one call, raising if it failed
Instant = Callable[[bool], None]  # makes the device's connection answer at once, or not


DEVICES = ("process", "simulator")  # where the gateway's device runs; the first is the default
DEVICE_SCRIPT = Path(__file__).with_name("_call_device.py")


@contextlib.asynccontextmanager
async def device_process(url: str) -> AsyncIterator[None]:
    """The lean device (``_call_device.py``) in a process of its own, connected to ``url``.

    It holds our pipe on its stdin and ends when that closes, even if this process is killed.
    """
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(DEVICE_SCRIPT), url, DEVICE_TOKEN, DEVICE_ID,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        if await child.stdout.readline() != b"ready\n":
            raise RuntimeError(f"the device process did not connect (exit {await child.wait()})")
        yield
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            async with asyncio.timeout(5):
                await child.wait()
        except TimeoutError:
            child.kill()
            await child.wait()


def _device(mode: str, url: str) -> contextlib.AbstractAsyncContextManager[object]:
    if mode == "simulator":
        return SimulatedDevice(url, DEVICE_TOKEN, device_id=DEVICE_ID)
    return device_process(url)


@contextlib.asynccontextmanager
async def gateway(
    data_dir: Path, device: str = DEVICES[0]
) -> AsyncIterator[tuple[str, Target, Instant]]:
    """Run the gateway with one device whose tools are listed (``device``: the lean device in
    a process of its own, or a ``SimulatedDevice`` in this process and loop); yield the MCP URL,
    the device hop (one call through the device connection alone) and the switch that makes
    the connection answer at once."""
    config = Config(
        data_dir=data_dir,
        device_listen=LOOPBACK,
        host_listen=LOOPBACK,
        mqtt_listen=None,
        device_tokens=(DEVICE_TOKEN,),
    )
    async with running(config) as run:
        registry = run.gateway.registry
        changes = registry.changes()  # subscribe before the device connects: no missed change
        async with _device(device, run.device_url):
            try:
                while not any(
                    t.device.device_id == DEVICE_ID and t.device.online
                    for t in registry.exposed_tools()
                ):
                    await anext(changes)
            finally:
                changes.close()
            tool = registry.lookup(GATEWAY_TOOL)
            session = tool.device.session if tool is not None else None
            if tool is None or session is None:
                raise RuntimeError(f"{GATEWAY_TOOL} is not listed")

            async def hop() -> None:
                result = await session.call(tool.spec.name, {})
                if result.get("isError"):
                    raise RuntimeError(f"{GATEWAY_TOOL} failed over the hop: {result}")

            # On the class: a connection may have no instance dict (slots).
            kind, calls = type(session), type(session).call

            async def at_once(self: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
                return {"content": [{"type": "text", "text": LAMP_STATE}]}

            def instant(on: bool) -> None:
                kind.call = at_once if on else calls  # type: ignore[method-assign]

            yield run.mcp_url, hop, instant


def _mcp_call(client: Client, tool: str, instant: Instant | None = None) -> Target:
    async def call() -> None:
        if instant is not None:
            instant(True)
        try:
            result = await client.call_tool(tool, {})
        finally:
            if instant is not None:
                instant(False)
        if result.is_error:
            raise RuntimeError(f"{tool} failed: {result.content}")

    return call


class Collections:
    """The garbage collector's runs in this process and the time they took (``gc.callbacks``):
    the calls' CPU includes them, whichever call's allocation set one off."""

    def __init__(self) -> None:
        self.runs, self.seconds, self._start = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.runs += 1
            self.seconds += time.perf_counter() - self._start


COLLECTIONS = Collections()


async def _timed_calls(call: Target, count: int, into: list[float]) -> tuple[float, float]:
    """Make ``count`` calls, each timed into ``into``; return the process CPU time they took
    and the collector's part of it."""
    cpu, collected = time.process_time(), COLLECTIONS.seconds
    for _ in range(count):
        start = time.perf_counter()
        await call()
        into.append(time.perf_counter() - start)
    return time.process_time() - cpu, COLLECTIONS.seconds - collected


def _summary(samples: list[float], cpu_s: float, gc_s: float) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "calls": len(ms),
        "median_ms": statistics.median(ms),
        "p99_ms": statistics.quantiles(ms, n=100, method="inclusive")[98],
        "cpu_ms": cpu_s * 1000 / len(ms),
        "gc_ms": gc_s * 1000 / len(ms),
    }


TARGETS = ("baseline", "gateway", "hop", "mcp")


@contextlib.asynccontextmanager
async def targets(data_dir: Path, device: str = DEVICES[0]) -> AsyncIterator[dict[str, Target]]:
    """Serve the bare server and the gateway (its device as ``device`` says); yield one call
    of each target, by name."""
    async with contextlib.AsyncExitStack() as stack:
        base_url = await stack.enter_async_context(baseline())
        gw_url, hop, instant = await stack.enter_async_context(gateway(data_dir, device))
        calls: dict[str, Target] = {"hop": hop}
        for name, url, tool in (
            ("baseline", base_url, BASELINE_TOOL),
            ("gateway", gw_url, GATEWAY_TOOL),
        ):
            client = await stack.enter_async_context(Client(url, mode="legacy"))
            await client.list_tools()  # the client caches output schemas from this
            calls[name] = _mcp_call(client, tool)
            if name == "gateway":  # the same session, its device answering at once
                calls["mcp"] = _mcp_call(client, tool, instant)
        yield calls


async def measure(
    calls: int, settle: bool = True, device: str = DEVICES[0], warmup: int = WARMUP
) -> dict[str, Any]:
    """Warm up (``warmup`` calls per target), then time ``calls`` calls per target in
    alternating blocks.

    ``settle``: once everything listens, tune the collector as ``esp-mcp-gateway serve`` does
    (``gateway.cli.heap.settle``); the bare server shares the process, so it gains alike.
    """
    samples: dict[str, list[float]] = {name: [] for name in TARGETS}
    cpu = dict.fromkeys(TARGETS, 0.0)
    collected = dict.fromkeys(TARGETS, 0.0)
    with tempfile.TemporaryDirectory(prefix="bench-") as data_dir:
        async with targets(Path(data_dir), device) as calls_of:
            if settle:
                heap.settle()
            for name in TARGETS:
                await _timed_calls(calls_of[name], warmup, [])
            order = list(TARGETS)
            done = 0
            while done < calls:
                block = min(BLOCK, calls - done)
                for name in order:
                    spent, gc_s = await _timed_calls(calls_of[name], block, samples[name])
                    cpu[name] += spent
                    collected[name] += gc_s
                order.reverse()
                done += block
    figures: dict[str, Any] = {
        name: _summary(samples[name], cpu[name], collected[name]) for name in TARGETS
    }
    figures["gc"] = "settled" if settle else "default"
    figures["device"] = device
    base, gw, hop_f = figures["baseline"], figures["gateway"], figures["hop"]
    figures["ratio"] = {
        "median": gw["median_ms"] / base["median_ms"],
        "p99": gw["p99_ms"] / base["p99_ms"],
        "cpu": gw["cpu_ms"] / base["cpu_ms"],
    }
    added = gw["median_ms"] - base["median_ms"]
    figures["added_ms"] = {
        "median": added,
        "beyond_hop": added - hop_f["median_ms"],
        "mcp": figures["mcp"]["median_ms"] - base["median_ms"],
    }
    return figures


def _table(figures: dict[str, Any]) -> str:
    columns = [("calls", "calls", 7, ""), ("median ms", "median_ms", 12, ".3f"),
               ("p99 ms", "p99_ms", 10, ".3f"), ("cpu ms", "cpu_ms", 9, ".3f"),
               ("gc ms", "gc_ms", 8, ".3f")]  # fmt: skip
    lines = target_rows(figures, TARGETS, columns)
    ratio, added = figures["ratio"], figures["added_ms"]
    lines += [
        f"gateway/baseline: median x{ratio['median']:.2f}, p99 x{ratio['p99']:.2f}, "
        f"cpu x{ratio['cpu']:.2f} (goal: median <= x1.10)",
        f"the gateway adds {added['median']:.3f} ms a call (goal <= 0.3 ms), of which the device "
        f"hop (hop's median) is {figures['hop']['median_ms']:.3f} ms and the rest "
        f"{added['beyond_hop']:.3f} ms",
        f"its host side alone (mcp: the device answering at once) adds {added['mcp']:.3f} ms",
        f"garbage collector: {figures['gc']} (gc ms: its share of each target's cpu ms)",
        f"device: {figures['device']} (cpu ms: this process's, "
        + (
            "the device's not included)"
            if figures["device"] == "process"
            else "the device's in it)"
        ),
    ]
    return "\n".join(lines)


def add_warmup_argument(parser: argparse.ArgumentParser) -> None:
    """--warmup: the calls per target before any is measured (tests/test_bench.py: a few)."""
    parser.add_argument("--warmup", type=int, default=WARMUP, help="calls per target first")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="timed calls per target")
    add_common_arguments(parser, timeout=120.0)
    add_warmup_argument(parser)
    parser.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's collector settings rather than settle them as the gateway does",
    )
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=DEVICES[0],
        help="where the gateway's device runs: a lean device in a process of its own (as a "
        "real device is another machine) or a SimulatedDevice in the bench's own process",
    )
    args = parser.parse_args()
    gc.callbacks.append(COLLECTIONS)
    calls, warmup = max(args.calls, 2), max(args.warmup, 1)
    return run_bench(
        "call_latency",
        args,
        lambda: measure(calls, not args.default_gc, args.device, warmup),
        _table,
    )


if __name__ == "__main__":
    sys.exit(main())
