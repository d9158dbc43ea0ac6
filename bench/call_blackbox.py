"""Calls through the gateway against a bare MCP SDK server, each a black box in its own process.

Run from the repository root, in the project's venv: ``python bench/call_blackbox.py [--json]``.

Four kinds of process, as a user would run them:

* the gateway, started as a user starts it (``python -m gateway serve``) with a data dir and a
  config of its own in a temp dir; the device presents a device token, so it is admitted at once;
* its device: the lean device of ``_call_device.py`` (one tool, answered at once), over WebSocket;
* a bare MCP SDK server (a low-level ``Server`` on uvicorn with h11, the parser the gateway's
  listeners use) whose one tool answers what the device answers, over streamable HTTP;
* this process, the client: the SDK's ``Client`` (streamable HTTP, one stateful session each).

Each round times, for each server in turn (the order alternating round by round, so load on
the machine hits all alike), ``--calls`` sequential calls over one session (median, p99), then
``--sessions`` sessions calling at once, ``--burst`` calls each (calls/s over the wall time),
and the CPU time the server's processes spent a call (from /proc). The table gives the median
of the rounds' figures and their spread (lowest-highest), gateway/bare round by round and what
the gateway adds a call. ``--tree DIR`` runs another checkout's gateway too (``tree``), to
compare before and after a change in one run. A measurement, not a test: it exits 0 (a broken
run exits 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEVICE_TOKEN = "bench-blackbox-device-token"
DEVICE_ID = "02:00:00:00:00:01"
GATEWAY_TOOL = "sim-esp32_0001_lamp_get_state"  # the lean device's tool, as the gateway names it
BARE_TOOL = "get_state"
LAMP_STATE = '{"power":false}'  # the device's answer (``_call_device.py``), so replies weigh alike
DEVICE_SCRIPT = Path(__file__).with_name("_call_device.py")
# Each figure of a round, and its column's title.
KEYS = {"median_ms": "median ms", "p99_ms": "p99 ms", "calls_per_s": "calls/s",
        "cpu_ms": "server cpu ms"}  # fmt: skip


def serve_bare() -> None:
    """The bare server (``--bare``): print its MCP URL, serve until stdin closes."""
    import mcp.types as types
    import uvicorn
    from mcp.server import Server
    from mcp.server import ServerRequestContext as Context
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp as Endpoint
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager as Manager
    from mcp.server.transport_security import TransportSecuritySettings
    from mcp.types import PaginatedRequestParams as Paginated
    from starlette.applications import Starlette
    from starlette.routing import Route

    tool = types.Tool(name=BARE_TOOL, input_schema={"type": "object", "properties": {}})

    async def list_tools(ctx: Context, params: Paginated | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool])

    async def call_tool(ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=LAMP_STATE)])

    server = Server("bench-bare", on_list_tools=list_tools, on_call_tool=call_tool)
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    manager = Manager(app=server, security_settings=security)
    app = Starlette(routes=[Route("/mcp", endpoint=Endpoint(manager))])
    config = uvicorn.Config(app, http="h11", lifespan="off", log_level="warning",
                            access_log=False, timeout_graceful_shutdown=2)  # fmt: skip
    web = uvicorn.Server(config)
    sock = socket.create_server(("127.0.0.1", 0))

    async def run() -> None:
        async with manager.run():
            serving = asyncio.create_task(web.serve(sockets=[sock]))
            while not web.started:  # noqa: ASYNC110 -- uvicorn says so by a flag only
                await asyncio.sleep(0.01)
            print(f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
            await asyncio.to_thread(sys.stdin.read)  # our parent holds the other end
            web.should_exit = True
            await serving

    asyncio.run(run())


@contextlib.contextmanager
def child(args: list[str], **kwargs: Any) -> Iterator[subprocess.Popen[str]]:
    """A process that holds our pipe on its stdin (its end, even our being killed, ends it)."""
    process = subprocess.Popen(args, stdin=subprocess.PIPE, text=True, **kwargs)
    try:
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
        process.kill()  # (a no-op once it has ended)
        process.wait()


def _wait_for_lines(log: Path, patterns: list[str], process: subprocess.Popen[str]) -> list[str]:
    """The first group of each pattern, once the log holds them all."""
    for _ in range(600):  # 30 s
        found = [re.search(p, log.read_text()) for p in patterns]
        if all(found) or process.poll() is not None:
            break
        time.sleep(0.05)
    if not all(found):
        raise RuntimeError(f"the gateway did not start:\n{log.read_text()}")
    return [m.group(1) for m in found if m]


def cpu_seconds(pids: list[int]) -> float:
    """The CPU time (user and system) the processes ``pids`` have used so far (Linux)."""
    stats = [Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split() for pid in pids]
    return sum(int(f[11]) + int(f[12]) for f in stats) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def gateway(data_dir: Path, tree: Path | None = None) -> Iterator[tuple[str, list[int]]]:
    """The gateway (of ``tree``, if given, else this checkout's) and its device running; yield
    its MCP URL and the processes that serve its calls."""
    data_dir.mkdir()
    (data_dir / "gateway.toml").write_text(
        f'device_tokens = ["{DEVICE_TOKEN}"]\nmqtt_listen = "off"\n'
        'device_listen = "127.0.0.1:0"\nhost_listen = "127.0.0.1:0"\n'
    )
    log = data_dir / "gateway.log"
    serve = [sys.executable, "-m", "gateway", "serve", "--config", str(data_dir / "gateway.toml"),
             "--data-dir", str(data_dir / "data")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    with log.open("w") as log_file, child(serve, stderr=log_file, env=env, cwd=tree) as process:
        device_url, mcp_url = _wait_for_lines(
            log, [r"devices connect to (\S+)", r"MCP hosts connect to (\S+)"], process
        )
        device_args = [sys.executable, str(DEVICE_SCRIPT), device_url, DEVICE_TOKEN, DEVICE_ID]
        with child(device_args, stdout=subprocess.PIPE) as device:
            assert device.stdout is not None
            if device.stdout.readline() != "ready\n":
                raise RuntimeError(f"the device did not connect:\n{log.read_text()}")
            yield mcp_url, [process.pid, device.pid]


@contextlib.contextmanager
def bare() -> Iterator[tuple[str, list[int]]]:
    """The bare server running; yield its MCP URL and its process."""
    with child([sys.executable, __file__, "--bare"], stdout=subprocess.PIPE) as process:
        assert process.stdout is not None
        yield process.stdout.readline().strip(), [process.pid]


async def _listed(client: Any, tool: str) -> None:
    """Wait until ``tool`` is listed (the device's discovery may still run)."""
    async with asyncio.timeout(30):
        while tool not in {t.name for t in (await client.list_tools()).tools}:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # asked again, as a host would


async def _calls(client: Any, tool: str, count: int, into: list[float] | None = None) -> None:
    for _ in range(count):
        start = time.perf_counter()
        result = await client.call_tool(tool, {})
        if into is not None:
            into.append(time.perf_counter() - start)
        if result.is_error:
            raise RuntimeError(f"{tool} failed: {result.content}")


async def _round(
    clients: list[Any], tool: str, calls: int, burst: int, pids: list[int]
) -> dict[str, float]:
    """One round against one server: ``calls`` sequential calls on the first session, then
    ``burst`` calls on every session at once."""
    samples: list[float] = []
    cpu = cpu_seconds(pids)
    await _calls(clients[0], tool, calls, samples)
    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for client in clients:
            group.create_task(_calls(client, tool, burst))
    wall = time.perf_counter() - start
    cpu = cpu_seconds(pids) - cpu
    ms = sorted(s * 1000 for s in samples)
    return {
        "median_ms": statistics.median(ms),
        "p99_ms": statistics.quantiles(ms, n=100, method="inclusive")[98],
        "calls_per_s": len(clients) * burst / wall,
        "cpu_ms": cpu * 1000 / (calls + len(clients) * burst),
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


async def measure(
    calls: int, rounds: int, sessions: int, burst: int, warmup: int, tree: Path | None = None
) -> dict[str, Any]:
    """Time every server's rounds, interleaved; return the figures (``tree``: a gateway of that
    checkout too, named ``tree``, beside this one's)."""
    from mcp import Client

    names = ["bare", "gateway", *(["tree"] if tree else [])]
    per_round: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bench-blackbox-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            served = {"bare": stack.enter_context(bare()),
                      "gateway": stack.enter_context(gateway(Path(tmp, "gateway")))}  # fmt: skip
            if tree is not None:
                served["tree"] = stack.enter_context(gateway(Path(tmp, "tree"), tree))
            clients: dict[str, list[Any]] = {}
            for name, (url, _) in served.items():
                tool = BARE_TOOL if name == "bare" else GATEWAY_TOOL
                clients[name] = [
                    await stack.enter_async_context(Client(url, mode="legacy"))
                    for _ in range(sessions)
                ]
                for client in clients[name]:
                    await _listed(client, tool)  # the client caches output schemas from this
                    await _calls(client, tool, warmup)
            for number in range(rounds):
                for name in names if number % 2 == 0 else reversed(names):
                    tool = BARE_TOOL if name == "bare" else GATEWAY_TOOL
                    figures = await _round(clients[name], tool, calls, burst, served[name][1])
                    per_round[name].append(figures)
    result: dict[str, Any] = {"calls": calls, "rounds": rounds, "sessions": sessions,
                              "burst": burst}  # fmt: skip
    for name in names:
        result[name] = {key: _spread([r[key] for r in per_round[name]]) for key in KEYS}
    # Each gateway against the bare server, and this one against the tree's, round by round.
    for name, other in [
        *((n, "bare") for n in names[1:]),
        *([("gateway", "tree")] if tree else []),
    ]:
        pairs = list(zip(per_round[other], per_round[name], strict=True))
        # (a round too short for the CPU clock's ticks has no CPU ratio)
        ratios = {key: [g[key] / b[key] for b, g in pairs if b[key]] for key in KEYS}
        result[f"{name}/{other}"] = {key: _spread(r) for key, r in ratios.items() if r}
        result[f"{name} added" if other == "bare" else f"{name}-{other}"] = {
            key: _spread([g[key] - b[key] for b, g in pairs]) for key in ("median_ms", "p99_ms")
        }
    return result


def _cell(f: dict[str, float], digits: int) -> str:
    return f"{f['median']:.{digits}f} ({f['low']:.{digits}f}-{f['high']:.{digits}f})"


def _table(figures: dict[str, Any]) -> str:
    lines = [
        f"{figures['rounds']} rounds of {figures['calls']} calls in a row, then {figures['burst']} "
        f"on each of {figures['sessions']} sessions at once (calls/s); median of the rounds "
        "(lowest-highest)",
        f"{'':<14}" + "".join(f"{title:>25}" for title in KEYS.values()),
    ]
    for name in [key for key in figures if isinstance(figures[key], dict)]:
        digits = 2 if "/" in name else 3
        cells = [_cell(figures[name][key], 0 if key == "calls_per_s" and digits == 3 else digits)
                 if key in figures[name] else "" for key in KEYS]  # fmt: skip
        lines.append(f"{name:<14}" + "".join(f"{cell:>25}" for cell in cells))
    lines.append("server cpu ms: a call's, over all of a round, the gateway's device included")
    lines.append("goals: gateway/bare median <= x1.10, added <= 0.3 ms; calls/s >= x1.00")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls in a row per round")
    parser.add_argument("--rounds", type=int, default=15, help="rounds, alternating the order")
    parser.add_argument("--burst", type=int, default=20, help="calls per session at once")
    parser.add_argument("--sessions", type=int, default=16, help="sessions calling at once")
    parser.add_argument("--warmup", type=int, default=20, help="untimed calls per session first")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole run, s")
    parser.add_argument("--tree", type=Path, help="another checkout's gateway to compare too")
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)  # the bare server
    args = parser.parse_args()
    if args.bare:
        serve_bare()
        return 0
    try:
        tree = args.tree.resolve() if args.tree else None
        counts = (max(args.calls, 2), max(args.rounds, 1), max(args.sessions, 1), args.burst)
        run = measure(*counts, args.warmup, tree)
        figures = asyncio.run(asyncio.wait_for(run, args.timeout))
    except Exception as exc:  # the figures decide nothing; a broken run does
        print(f"call_blackbox: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(figures, indent=2) if args.json else _table(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
