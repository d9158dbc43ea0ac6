"""The device of ``call_latency.py`` in a process of its own, as lean as a device can be.

Run by the bench, not by hand::

    python bench/_call_device.py DEVICE_URL TOKEN DEVICE_ID

A real device is another machine: its work and its caches are not the gateway's. This one is a
plain ``websockets`` client that does what stock firmware does on the wire (docs/protocol.md
§1, §4) for one tool, ``self.lamp.get_state`` of a ``sim-esp32`` board (the simulated lamp's
name, schema and answer), and nothing more: every reply is made once at start, and a
``tools/call`` only has its id pasted in. It prints ``ready`` once the gateway has said hello,
and exits when the gateway closes the connection or its stdin closes (the bench went away).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

BOARD = "sim-esp32"  # serverInfo.name: the gateway names the tool sim-esp32_0001_lamp_get_state
LAMP_STATE = '{"power":false}'  # what the simulated lamp answers, as the bare server does
TOOL = {
    "name": "self.lamp.get_state",
    "description": "The power state of the lamp connected to this board.",
    "inputSchema": {"type": "object", "properties": {}},
}
HELLO = json.dumps(
    {"type": "hello", "version": 1, "features": {"mcp": True}, "transport": "websocket",
     "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1,
                      "frame_duration": 60}},
    separators=(",", ":"),
)  # fmt: skip
RESULTS = {
    "initialize": {
        "protocolVersion": "2024-11-05",
        "capabilities": {"tools": {}},
        "serverInfo": {"name": BOARD, "version": "1.0.0"},
    },
    "tools/list": {"tools": [TOOL]},
    "tools/call": {"content": [{"type": "text", "text": LAMP_STATE}], "isError": False},
}


def _replies(session: str) -> tuple[str, dict[str, str]]:
    """The text of every reply before its id, and per method the text after it."""
    head = json.dumps({"session_id": session, "type": "mcp"}, separators=(",", ":"))
    after = {
        method: f',"result":{json.dumps(result, separators=(",", ":"))}}}}}'
        for method, result in RESULTS.items()
    }
    return head[:-1] + ',"payload":{"jsonrpc":"2.0","id":', after


async def _serve(ws: ClientConnection) -> None:
    head, after = _replies("")
    async for text in ws:
        message: Any = json.loads(text)
        kind = message.get("type")
        if kind == "hello":
            head, after = _replies(str(message.get("session_id") or ""))
            print("ready", flush=True)
            continue
        payload = message.get("payload") if kind == "mcp" else None
        if not isinstance(payload, dict) or not isinstance(payload.get("id"), int):
            continue  # notifications, and what stock would not answer either
        method = payload.get("method")
        tail = after.get(method) if isinstance(method, str) else None
        if tail is None:  # stock's answer to what it does not implement: no error code
            error = json.dumps({"message": f"Method not implemented: {method}"})
            tail = f',"error":{error}}}}}'
        await ws.send(f"{head}{payload['id']}{tail}")


async def main(url: str, token: str, device_id: str) -> None:
    headers = {"Authorization": f"Bearer {token}", "Protocol-Version": "1",
               "Device-Id": device_id, "Client-Id": "bench-call-device"}  # fmt: skip
    # No compression (stock offers none), no pings (a device answers them, never sends).
    async with connect(url, additional_headers=headers, user_agent_header=None,
                       compression=None, proxy=None, ping_interval=None) as ws:  # fmt: skip
        await ws.send(HELLO)
        serving = asyncio.create_task(_serve(ws))
        # The bench holds our stdin: its end (the bench gone, even killed) ends the device.
        stdin = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(stdin)
        await asyncio.get_running_loop().connect_read_pipe(lambda: protocol, sys.stdin)
        bench_gone = asyncio.ensure_future(stdin.read())
        await asyncio.wait({serving, bench_gone}, return_when=asyncio.FIRST_COMPLETED)
        serving.cancel()
        bench_gone.cancel()


if __name__ == "__main__":
    try:
        asyncio.run(main(*sys.argv[1:4]))
    except (ConnectionClosed, KeyboardInterrupt):
        pass
