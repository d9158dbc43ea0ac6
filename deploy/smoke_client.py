"""An MCP host outside the container, as deploy/test-image.sh uses it (the SDK's own client).

    smoke_client.py tools  URL TOKEN   the meta-tools are listed; no token means 401
    smoke_client.py device URL TOKEN   a simulated device's tools appear and a call works
    smoke_client.py relay  URL TOKEN   the same through deploy/claude_desktop_config.example.json:
                                       `esp-mcp-gateway stdio --connect`, as Claude Desktop runs it

URL is the gateway's /mcp endpoint. Every wait is bounded; exit status 1 with one line that
says what was expected, on any failure.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

DEVICE_TOOL = "sim-esp32_0001_lamp_turn_on"
STATE_TOOL = "sim-esp32_0001_lamp_get_state"


class Failed(Exception):
    """What the check expected and did not see."""


async def tool_names(url: str, token: str) -> list[str]:
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=auth, timeout=10) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            return [tool.name for tool in (await client.list_tools()).tools]


async def check_tools(url: str, token: str) -> None:
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "test-image", "version": "0"}}}  # fmt: skip
    async with httpx2.AsyncClient(timeout=10) as http:
        refused = await http.post(
            url, json=init, headers={"Accept": "application/json, text/event-stream"}
        )
    if refused.status_code != 401:
        raise Failed(f"/mcp without the host token answered {refused.status_code}, not 401")
    names = await tool_names(url, token)
    if names[:2] != ["list_devices", "call_device_tool"]:
        raise Failed(f"expected the meta-tools first, got {names}")
    print(f"tools over MCP: {names}")


async def check_device(url: str, token: str) -> None:
    names: list[str] = []
    with anyio.move_on_after(30):
        while DEVICE_TOOL not in names:
            names = await tool_names(url, token)
            if DEVICE_TOOL not in names:
                await anyio.sleep(0.5)
    if DEVICE_TOOL not in names:
        raise Failed(f"the simulated device's {DEVICE_TOOL} did not appear within 30 s: {names}")
    print(f"the simulated device's tools are listed ({len(names)} tools)")
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=auth, timeout=10) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            turned_on = await client.call_tool(DEVICE_TOOL, {})
            state = await client.call_tool(STATE_TOOL, {})
    texts = [getattr(item, "text", "") for item in (*turned_on.content, *state.content)]
    if turned_on.is_error or texts[0] != "true" or json.loads(texts[1]).get("power") is not True:
        raise Failed(f"calls through the gateway returned {texts}")
    print(f"called {DEVICE_TOOL} through the gateway: {texts[0]}; lamp state {texts[1]}")


async def check_relay(url: str, token: str) -> None:
    example = Path(__file__).with_name("claude_desktop_config.example.json")
    (entry,) = json.loads(example.read_text())["mcpServers"].values()
    # The example with this machine's values filled in: the venv's command, the real URL.
    command = Path(sys.executable).with_name(Path(entry["command"]).name)
    args = [url if arg.startswith("http://") else arg for arg in entry["args"]]
    env = {
        **os.environ,
        **entry["env"],
        "GATEWAY_HOST_TOKEN": token,
        "GATEWAY_LOG_LEVEL": "warning",
    }
    params = StdioServerParameters(command=str(command), args=args, env=env)
    async with Client(params, mode="legacy") as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        result = await client.call_tool(DEVICE_TOOL, {}) if DEVICE_TOOL in names else None
    if result is None or result.is_error:
        raise Failed(f"through the stdio relay: tools {names}, call {result}")
    print(f"Claude Desktop's entry (stdio --connect) lists {len(names)} tools and calls them")


CHECKS = {"tools": check_tools, "device": check_device, "relay": check_relay}


async def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in CHECKS:
        print(__doc__, file=sys.stderr)
        return 2
    check = CHECKS[argv[0]]
    try:
        with anyio.fail_after(60):
            await check(argv[1], argv[2])
    except Failed as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"FAILED: the {argv[0]} check did not finish within 60 s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main, sys.argv[1:]))
