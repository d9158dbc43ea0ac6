"""Replay tests/vectors/ from the device side: this module plays the gateway, the firmware is
tested (tests/vectors/README.md, "Replaying").

It is written in the subset MicroPython shares with CPython, so the very same replay runs
in-process under pytest (test_vectors.py) and on the real MicroPython unix port::

    MICROPYPATH=.frozen:device_fw micropython tests/device_fw/vector_replay.py tests/vectors

which prints one ``PASS name`` or ``FAIL name: why`` line per device-side vector.

The device under test is the firmware's own runtime (fw_device.Device) with its MCP server
(fw_mcp), over a scripted link standing in for the WebSocket. As the README asks, it is set up
as the board the vector recorded: the tools of the recorded tools/list replies, in that order
and page split, each stubbed to give the recorded result or error; the serverInfo, error codes,
ping and listChanged that the recording shows; and, for a stock board, the stock hello (a
vector of our firmware must show the firmware's own hello).
"""

import asyncio
import json
import os
import sys

import fw_envelope as env
from fw_device import Device
from fw_mcp import McpServer, Prop, Tool, ToolError


class ScriptLink:
    """A link whose far end is this script: frames fed in, frames collected."""

    max_message = 65535

    def __init__(self, hello):
        self.hello = hello
        self.session_id = ""
        self.sent = []
        self.inbox = []

    async def open(self):
        self.sent.append(env.dumps(self.hello))

    def feed(self, message):
        """Take a gateway frame: a hello sets the session (as WsLink does), others queue."""
        if message.get("type") == "hello":
            session_id = env.server_session(message, self.session_id)
            if session_id is not None:
                self.session_id = session_id
            return None
        return message

    async def send(self, text):
        self.sent.append(text)

    async def recv(self):
        return None

    async def close(self):
        pass

    def abort(self):
        pass


def _device_messages(vector):
    return [step.get("message") for step in vector["exchange"] if step["from"] == "device"]


def _payloads(vector, side):
    found = []
    for step in vector["exchange"]:
        message = step.get("message")
        if step["from"] == side and message and message.get("type") == "mcp":
            found.append(message["payload"])
    return found


def _requests_and_replies(vector):
    """(request payload, device reply payload or None) for every gateway request."""
    replies = {}
    for payload in _payloads(vector, "device"):
        if "id" in payload:
            replies[payload["id"]] = payload
    return [(p, replies.get(p.get("id"))) for p in _payloads(vector, "gateway") if "id" in p]


def _prop(name, schema, required):
    default = None if name in required else schema.get("default")
    return Prop(
        name,
        schema["type"],
        default,
        schema.get("minimum"),
        schema.get("maximum"),
        schema.get("description"),
    )


def _stub(name, outcomes):
    def handler(args):
        outcome = outcomes[name].pop(0)
        if "error" in outcome:
            error = outcome["error"]
            raise ToolError(error["message"], error.get("code", env.TOOL_FAILED))
        return outcome["result"]["content"][0]["text"]

    return handler


def _tool(listed, outcomes):
    schema = listed.get("inputSchema", {})
    required = schema.get("required", [])
    props = [_prop(n, s, required) for n, s in schema.get("properties", {}).items()]
    annotations = dict(listed.get("annotations") or {})
    user = annotations.pop("audience", None) == ["user"]
    return Tool(
        listed["name"],
        listed["description"],
        props,
        _stub(listed["name"], outcomes),
        user,
        annotations or None,
    )


def _page_limit(pages):
    """A page size that splits the recorded tools/list pages exactly where they split."""
    low, high = 0, 1 << 30
    for page in pages:
        used = 10 + sum(len(env.dumps(tool).encode()) + 1 for tool in page["tools"]) + 30
        low = max(low, used)
        following = page.get("nextCursor")
        for later in pages:
            for tool in later["tools"]:
                if tool["name"] == following:
                    high = min(high, used + len(env.dumps(tool).encode()) + 1 - 1)
    if low > high:
        raise AssertionError(f"no page size reproduces the recorded split ({low} > {high})")
    return low


class Board:
    """The board a vector recorded, rebuilt on the firmware."""

    def __init__(self, vector):
        exchange = _requests_and_replies(vector)
        self.listings = []  # successive full catalogues, one per listing from the first page
        pages = []
        self.outcomes = {}
        info = {"name": "esp-mcp-device", "version": "0.1.0"}
        list_changed = codes = False
        ping = True
        for request, reply in exchange:
            method = request["method"]
            if reply is not None and "error" in reply and "code" in reply["error"]:
                codes = True
            if method == "initialize" and reply is not None:
                info = reply["result"]["serverInfo"]
                tools_caps = reply["result"]["capabilities"].get("tools", {})
                list_changed = tools_caps.get("listChanged") is True
            elif method == "ping" and reply is not None:
                ping = "result" in reply
            elif method == "tools/list" and reply is not None and "result" in reply:
                page = reply["result"]
                pages.append(page)
                if not (request.get("params") or {}).get("cursor"):
                    self.listings.append([])
                self.listings[-1].extend(page["tools"])
            elif method == "tools/call" and reply is not None:
                name = request["params"]["name"]
                self.outcomes.setdefault(name, []).append(reply)
        for payload in _payloads(vector, "device"):
            if payload.get("method") == "notifications/tools/list_changed":
                list_changed = True
        self.server = McpServer(info["name"], info["version"], codes, ping, list_changed)
        if pages:
            self.server.page_limit = _page_limit(pages)
        self.registered = []
        self.register(self.listings[0] if self.listings else [])
        for name in self.outcomes:
            if self.server.find(name) is None:
                self.server.add(Tool(name, name, (), _stub(name, self.outcomes)))
        self.own_firmware = list_changed

    def register(self, listed):
        for tool in listed:
            if tool["name"] not in self.registered:
                self.registered.append(tool["name"])
                self.server.add(_tool(tool, self.outcomes))

    def change_tools(self):
        """The next recorded catalogue: register what it adds."""
        later = [listing for listing in self.listings if len(listing) > len(self.registered)]
        self.register(later[0] if later else [])


async def replay(vector):
    """Play the gateway's side of ``vector``; raise AssertionError at the first difference."""
    board = Board(vector)
    hellos = [m for m in _device_messages(vector) if m and m.get("type") == "hello"]
    if hellos and board.own_firmware and hellos[0] != env.HELLO:
        raise AssertionError(f"our firmware's hello {env.HELLO} is not the vector's {hellos[0]}")
    link = ScriptLink(hellos[0] if hellos else env.HELLO)
    device = Device(board.server, link, "vector")
    device.connected = True
    matched = 0
    for index, step in enumerate(vector["exchange"]):
        if step["from"] == "gateway":
            if matched != len(link.sent):
                raise AssertionError(f"step {index}: unexpected frame {link.sent[matched]}")
            message = step.get("message") or env.decode(step["text"])
            message = link.feed(message)
            if message is not None:
                device.dispatch(message)
                await device.drain()
            continue
        if step.get("trigger") == "connect":
            await link.open()
        elif step.get("trigger") == "tools_changed":
            board.change_tools()
            await device.drain()
        if matched >= len(link.sent):
            raise AssertionError(f"step {index}: the device sent nothing")
        got = json.loads(link.sent[matched])
        matched += 1
        if got != step["message"]:
            raise AssertionError(f"step {index}: sent {got}, the vector has {step['message']}")
    if matched != len(link.sent):
        raise AssertionError(f"unexpected frames at the end: {link.sent[matched:]}")


def device_vectors(directory):
    """(name, vector) for every vector the device side can replay, by name."""
    found = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(directory + "/" + name) as handle:
                vector = json.load(handle)
            if "device" in vector["sides"]:
                found.append((name[:-5], vector))
    return found


async def main(directory):
    failures = 0
    for name, vector in device_vectors(directory):
        try:
            await replay(vector)
            print("PASS", name)
        except AssertionError as exc:
            failures += 1
            print("FAIL", name + ":", exc)
    return failures


if __name__ == "__main__":
    sys.exit(1 if asyncio.run(main(sys.argv[1])) else 0)
