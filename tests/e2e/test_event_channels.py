"""Claude Code channels: a device's opted-in events pushed into a stdio session.

The gateway runs as a host starts it (``esp-mcp-gateway stdio``, a subprocess). The MCP SDK's
client can neither declare ``experimental`` capabilities nor hand unknown notifications on, so
the host here replays, line by line, the handshake of Claude Code 2.1.332 (its ``initialize``:
``clientInfo.name`` "claude-code", no ``claude/channel`` client capability; read from its
binary), of a client that declares ``experimental["claude/channel"]``, and of one that does not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from tests.conftest import DEVICE_TOKEN, bound
from tests.e2e.test_device_events import porch
from tests.e2e.test_stdio_and_cli import cli_env
from tests.ports import outside_ephemeral

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

JsonObject = dict[str, Any]

CLAUDE_CODE = {"name": "claude-code", "title": "Claude Code", "version": "2.1.332"}
OTHER = {"name": "some-host", "version": "1.0"}


class StdioHost:
    """A host speaking newline-delimited JSON-RPC to the gateway's stdin and stdout."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._buffer = b""
        self.notifications: list[JsonObject] = []

    async def send(self, message: JsonObject) -> None:
        assert self._process.stdin is not None
        await self._process.stdin.send(json.dumps(message).encode() + b"\n")

    async def request(self, request_id: int, method: str, params: JsonObject) -> JsonObject:
        """Send a request; return its response (notifications met meanwhile are kept)."""
        await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        while True:
            message = await self.next()
            if message.get("id") == request_id:
                return message

    async def next(self) -> JsonObject:
        assert self._process.stdout is not None
        with anyio.fail_after(bound(20)):
            while b"\n" not in self._buffer:
                self._buffer += await self._process.stdout.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: JsonObject = json.loads(line)
        if "id" not in message:
            self.notifications.append(message)
        return message

    async def handshake(self, client_info: JsonObject, capabilities: JsonObject) -> JsonObject:
        params = {"protocolVersion": "2025-11-25", "capabilities": capabilities,
                  "clientInfo": client_info}  # fmt: skip
        reply = await self.request(0, "initialize", params)
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply


def channels(host: StdioHost) -> list[JsonObject]:
    return [n for n in host.notifications if n["method"] == "notifications/claude/channel"]


@pytest.mark.parametrize(
    ("client_info", "capabilities", "pushed"),
    [
        (CLAUDE_CODE, {"roots": {}}, True),
        (OTHER, {"experimental": {"claude/channel": {}}}, True),
        (OTHER, {"roots": {}}, False),
    ],
    ids=["claude-code", "declares-channel", "declares-nothing"],
)
async def test_opted_in_events_reach_a_stdio_session_that_asked_for_channels(
    tmp_path: Path, client_info: JsonObject, capabilities: JsonObject, pushed: bool
) -> None:
    """The server declares claude/channel; the button event (opted in) becomes one
    notifications/claude/channel {content, meta} for a session that asked; the door event (not
    opted in) never does; a session that did not ask gets none at all."""
    device = porch()
    config = tmp_path / "gateway.toml"
    config.write_text(f'[devices."{device.device_id}"]\nname = "porch"\nchannel = ["button"]\n')
    device_port = outside_ephemeral()
    env = cli_env(tmp_path / "data", GATEWAY_CONFIG=str(config), GATEWAY_DEVICE_TOKEN=DEVICE_TOKEN,
                  GATEWAY_DEVICE_LISTEN=f"127.0.0.1:{device_port}",
                  GATEWAY_HOST_LISTEN="127.0.0.1:0")  # fmt: skip
    command = [sys.executable, "-m", "gateway", "stdio"]
    async with (
        await anyio.open_process(command, env=env) as process,
        anyio.create_task_group() as tg,
    ):
        host = StdioHost(process)
        reply = await host.handshake(client_info, capabilities)
        assert reply["result"]["capabilities"]["experimental"] == {"claude/channel": {}}
        await tg.start(device.serve, f"ws://127.0.0.1:{device_port}/xiaozhi/v1/")
        read = {"uri": "device://porch/events"}
        with anyio.fail_after(bound(20)):  # the device is listed once its tools are
            while "error" in await host.request(1, "resources/read", read):
                await host.next()  # tools/list_changed: the device is there
        await device.report("door", {"open": True})
        await device.report("button", {"pressed": 1})
        request_id = 2
        while True:  # until the gateway holds both events: a push would have gone by then
            events = json.loads(
                (await host.request(request_id, "resources/read", read))["result"]["contents"][0][
                    "text"
                ]
            )
            request_id += 1
            if len(events) == 2:
                break
        if pushed:
            while not channels(host):
                await host.next()
            [message] = channels(host)
            assert message["params"]["meta"] == {"device": "porch", "logger": "button",
                                                 "level": "info", "seq": "2"}  # fmt: skip
            assert message["params"]["content"] == 'porch button (info): {"pressed": 1}'
        else:
            await host.request(request_id, "ping", {})
            assert channels(host) == []
        await device.close()
        tg.cancel_scope.cancel()
        await process.stdin.aclose()  # type: ignore[union-attr]
