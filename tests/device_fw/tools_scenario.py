"""The firmware's default tools as a client sees them: every tools/list page and the result of
every tool that declares an outputSchema, printed as one JSON line.

Written in the subset MicroPython shares with CPython, so test_fw_tools.py checks the same
output in-process and from the real MicroPython unix port::

    MICROPYPATH=.frozen:device_fw micropython tests/device_fw/tools_scenario.py [page_limit]
"""

import asyncio
import json
import sys

from fw_board import SimBoard
from fw_config import DEFAULTS, merge
from fw_mcp import McpServer
from fw_tools import default_tools

# Undeclared keys are ignored (the stock rule), so one argument set fits every tool.
ARGUMENTS = {"color": "orange", "brightness": 50}


async def rpc(server, method, params):
    reply = await server.handle({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    return reply["result"]


async def collect(page_limit=8000):
    """{"pages": [tools/list results], "results": {tool name: tools/call result}}."""
    board = SimBoard(merge(DEFAULTS, {"pins": {"outputs": {"led": 2, "fan": 4}}}))
    server = McpServer("fwtest", "0.1.0")
    for tool in default_tools(board):
        server.add(tool)
    server.page_limit = page_limit
    pages = []
    params = {"withUserTools": True}
    while True:
        page = await rpc(server, "tools/list", params)
        pages.append(page)
        if "nextCursor" not in page:
            break
        params = {"withUserTools": True, "cursor": page["nextCursor"]}
    results = {}
    for tool in server.tools:
        if tool.output:
            call = {"name": tool.name, "arguments": ARGUMENTS}
            results[tool.name] = await rpc(server, "tools/call", call)
    return {"pages": pages, "results": results}


if __name__ == "__main__":
    limit = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    print(json.dumps(asyncio.run(collect(limit))))
