"""self.camera.take_photo on the simulated board: this script plays the gateway against the
firmware's MCP server (fw_mcp) and camera tool (fw_camera), uploading to a test's server.

Written in the subset MicroPython shares with CPython, so test_fw_camera.py runs the same
calls in-process and on the real MicroPython unix port::

    MICROPYPATH=.frozen:device_fw micropython tests/device_fw/camera_scenario.py http://127.0.0.1:PORT

which prints one JSON line per call: {"case": ..., "reply": <the JSON-RPC reply>}.
"""

import asyncio
import json
import sys

from fw_app import build
from fw_board import SimBoard
from fw_camera import camera_tool
from fw_config import DEFAULTS, merge
from fw_mcp import McpServer

DEVICE_ID = "02:00:00:00:ca:01"
CLIENT_ID = "5c7e1f0a-2b3c-4d5e-8f90-a1b2c3d4e5f6"
QUESTION = "What colour is this? (é)"


def cases(base):
    """(case, capabilities.vision or None) in order; the vision URL stays until replaced."""
    return [
        ("no_url", None),
        ("ok", {"url": base + "/vision/explain", "token": "vision-token"}),
        ("no_token", {"url": base + "/vision/explain"}),
        ("chunked", {"url": base + "/chunked", "token": "vision-token"}),
        ("refused", {"url": base + "/refused", "token": "wrong"}),
        ("too_long", {"url": base + "/too-long", "token": "vision-token"}),
        ("unreachable", {"url": "http://127.0.0.1:1/vision/explain", "token": "t"}),
    ]


def server_for(camera):
    board = SimBoard(merge(DEFAULTS, {"camera": camera}))
    server = McpServer("camtest", "0.1.0")
    server.add(camera_tool(board, server, DEVICE_ID, CLIENT_ID))
    return server


async def rpc(server, method, params):
    return await server.handle({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})


async def run(base, report):
    """Call take_photo once per case, passing each reply to ``report(case, reply)``."""
    server = server_for(True)
    call = {"name": "self.camera.take_photo", "arguments": {"question": QUESTION}}
    for case, vision in cases(base):
        if vision is not None:
            await rpc(server, "initialize", {"capabilities": {"vision": vision}})
        report(case, await rpc(server, "tools/call", call))
    blind = server_for(False)  # the tool is there, but the camera takes nothing
    await rpc(blind, "initialize", {"capabilities": {"vision": cases(base)[1][1]}})
    report("no_photo", await rpc(blind, "tools/call", call))
    for camera in (True, False):  # the firmware as it boots: the tool only on a camera board
        settings = {"url": "ws://gw/xiaozhi/v1/", "board": "sim", "client_id": CLIENT_ID}
        settings["camera"] = camera
        _board, booted, _device = build(merge(DEFAULTS, settings))
        report("booted_camera" if camera else "booted", [tool.name for tool in booted.tools])


def _print(case, reply):
    print(json.dumps({"case": case, "reply": reply}))


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], _print))
