"""The cheapest server a stock WebSocket device can join, for ``fleet.py``'s storm.

A bare ``websockets`` server that completes the handshake (token checked), answers the hello and
reads the ``tools/list`` pages, and nothing more: the hello and the requests are serialised
once, and a page is only searched for its ``nextCursor`` (no JSON parsing). Beside the fuller
baseline of ``_fleet_devices`` (which parses every message and matches replies by id, as a
real server must), it says what the gateway's join costs against the floor of the wire itself.
"""

from __future__ import annotations

import asyncio
import json
import re
from multiprocessing.connection import Connection

from _fleet_devices import STOCK_HELLO_WAIT, serve_devices
from _processes import child_main
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

__all__ = ["lean_baseline_main"]

_SESSION = "bench-lean"
_HELLO = json.dumps({
    "type": "hello", "transport": "websocket", "session_id": _SESSION,
    "audio_params": {"format": "opus", "sample_rate": 24000, "channels": 1, "frame_duration": 60},
})  # fmt: skip
_INITIALIZE = json.dumps({"session_id": _SESSION, "type": "mcp", "payload": {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2024-11-05", "capabilities": {},
               "clientInfo": {"name": "bench-lean", "version": "1"}},
}})  # fmt: skip
_CURSOR = re.compile(r'"nextCursor"\s*:\s*"([^"]+)"')


def _list_request(call_id: int, cursor: str) -> str:
    params = f'{{"cursor":{json.dumps(cursor)}}}' if cursor else "{}"
    return (f'{{"session_id":"{_SESSION}","type":"mcp","payload":{{"jsonrpc":"2.0",'
            f'"id":{call_id},"method":"tools/list","params":{params}}}}}')  # fmt: skip


async def _session(ws: ServerConnection) -> None:
    """Hello, initialize, every page; the device's replies come in order, one at a time."""
    try:
        async with asyncio.timeout(STOCK_HELLO_WAIT):
            await ws.recv()  # the device hello: a stock device sends nothing before it
        await ws.send(_HELLO)
        await ws.send(_INITIALIZE)
        await ws.recv()
        call_id, cursor = 2, ""
        while True:
            await ws.send(_list_request(call_id, cursor))
            found = _CURSOR.search(str(await ws.recv()))
            if found is None:
                break
            cursor, call_id = found.group(1), call_id + 1
        await ws.wait_closed()  # the device stays, idle
    except (ConnectionClosed, TimeoutError):
        pass


def lean_baseline_main(conn: Connection, token: str) -> None:
    """Entry point of the lean baseline's process: sends its port, serves until told to stop."""
    child_main(serve_devices(conn, token, _session))
