"""notifications/cancelled on the firmware: this script plays the gateway against the firmware's
runtime (fw_device.Device) and MCP server (fw_mcp) over a scripted link.

It is written in the subset MicroPython shares with CPython, so test_fw_mcp.py runs the same
checks in-process and on the real MicroPython unix port::

    MICROPYPATH=.frozen:device_fw micropython tests/device_fw/cancel_scenario.py

which prints one ``PASS name`` or ``FAIL name: why`` line per check.
"""

import asyncio
import json
import sys

from fw_device import Device
from fw_mcp import McpServer, Tool

SECONDS = 5  # the most any wait may take


class Link:
    """The gateway's end: frames fed in with ``feed`` (None ends the session), replies kept."""

    max_message = 65535
    session_id = "s"

    def __init__(self):
        self.sent = []
        self.inbox = []
        self.ready = asyncio.Event()

    def feed(self, message):
        self.inbox.append(message)
        self.ready.set()

    async def recv(self):
        while not self.inbox:
            self.ready.clear()
            await self.ready.wait()
        return self.inbox.pop(0)

    async def send(self, text):
        self.sent.append(json.loads(text)["payload"])

    def abort(self):
        pass


class Board:
    """A device with ``self.hold`` (waits until cancelled) and ``self.quick`` (answers)."""

    def __init__(self):
        self.started = asyncio.Event()
        self.stopped = asyncio.Event()
        self.server = McpServer("board", "1")
        self.server.add(Tool("self.hold", "Waits until cancelled.", (), self.hold))
        self.server.add(Tool("self.quick", "Answers at once.", (), lambda args: "done"))
        self.link = Link()
        self.device = Device(self.server, self.link, "cancel")
        self.device.connected = True

    async def hold(self, args):
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopped.set()
            raise

    def call(self, request_id, name):
        params = {"name": name, "arguments": {}}
        payload = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        self.link.feed({"session_id": "s", "type": "mcp", "payload": payload})

    def cancel(self, request_id):
        params = {"requestId": request_id, "reason": "timed out"}
        payload = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
        self.link.feed({"session_id": "s", "type": "mcp", "payload": payload})


def answer(request_id, text):
    result = {"content": [{"type": "text", "text": text}], "isError": False}
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def expect(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: {repr(got)}, expected {repr(want)}")


async def wait(event):
    await asyncio.wait_for(event.wait(), SECONDS)


async def serve(board, steps):
    """Serve the link while ``steps`` runs, then end the session and wait for every task."""
    serving = asyncio.create_task(board.device.serve())
    try:
        await steps()
    finally:
        board.link.feed(None)
        await asyncio.wait_for(serving, SECONDS)


async def a_cancelled_call_stops_and_gets_no_reply():
    """The handler gets CancelledError; the call is never answered; other calls are."""
    board = Board()

    async def steps():
        board.call(7, "self.hold")
        await wait(board.started)
        board.call(8, "self.quick")
        board.cancel(7)
        await wait(board.stopped)
        await asyncio.wait_for(board.device.drain(), SECONDS)

    await serve(board, steps)
    expect("sent", board.link.sent, [answer(8, "done")])
    expect("running", board.server.running, {})


async def a_cancellation_for_no_running_call_is_ignored():
    """Unknown, finished and malformed cancellations change nothing and get no reply."""
    board = Board()

    async def steps():
        board.cancel(99)
        board.call(1, "self.quick")
        await asyncio.wait_for(board.device.drain(), SECONDS)
        board.cancel(1)
        payload = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": "x"}
        board.link.feed({"session_id": "s", "type": "mcp", "payload": payload})
        board.call(2, "self.quick")
        await asyncio.wait_for(board.device.drain(), SECONDS)
        expect("cancel(2)", board.server.cancel(2), False)

    await serve(board, steps)
    expect("sent", board.link.sent, [answer(1, "done"), answer(2, "done")])


async def losing_the_link_stops_a_running_handler():
    """When the session ends, a handler still running is cancelled with it."""
    board = Board()

    async def steps():
        board.call(3, "self.hold")
        await wait(board.started)

    await serve(board, steps)
    await wait(board.stopped)
    expect("sent", board.link.sent, [])
    expect("running", board.server.running, {})


CHECKS = [
    ("a_cancelled_call_stops_and_gets_no_reply", a_cancelled_call_stops_and_gets_no_reply),
    (
        "a_cancellation_for_no_running_call_is_ignored",
        a_cancellation_for_no_running_call_is_ignored,
    ),
    ("losing_the_link_stops_a_running_handler", losing_the_link_stops_a_running_handler),
]


async def main():
    failures = 0
    for name, check in CHECKS:
        try:
            await check()
            print("PASS", name)
        except Exception as exc:
            failures += 1
            print("FAIL", name + ":", repr(exc))
    return failures


if __name__ == "__main__":
    sys.exit(1 if asyncio.run(main()) else 0)
