"""The device runtime (fw_device): dispatch, replies, notifications, reconnect backoff."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from device_fw import fw_device
from device_fw.fw_device import Device, backoff
from device_fw.fw_mcp import McpServer, Tool
from tests.conftest import bound

pytestmark = pytest.mark.anyio


class FakeLink:
    """A link fed by the test: ``fail`` opens fail first, then each session reads ``script``."""

    max_message = 200

    def __init__(self, script: list[dict[str, Any] | None], fail: int = 0) -> None:
        self.session_id = "s"
        self.script = script
        self.fail = fail
        self.opened = 0
        self.sent: list[dict[str, Any]] = []
        self.aborted = 0
        self.ended = asyncio.Event()

    async def open(self) -> None:
        self.opened += 1
        if self.fail:
            self.fail -= 1
            raise OSError("refused")

    async def recv(self) -> dict[str, Any] | None:
        if self.script:
            return self.script.pop(0)
        self.ended.set()
        await asyncio.Event().wait()  # a quiet link: until cancelled
        return None

    async def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def close(self) -> None:
        pass

    def abort(self) -> None:
        self.aborted += 1


def request(request_id: int, method: str, **params: Any) -> dict[str, Any]:
    payload = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
    return {"session_id": "g", "type": "mcp", "payload": payload}


def server() -> McpServer:
    mcp = McpServer("b", "1")
    mcp.add(Tool("self.big", "", (), lambda args: "x" * 500))
    return mcp


def test_backoff_doubles_to_the_ceiling_with_jitter_down_to_half() -> None:
    """Attempt n waits between half and all of min(high, low * 2**n), never below low."""
    for attempt in range(10):
        ceiling = min(30.0, 2.0**attempt)
        for _ in range(20):
            assert max(1.0, ceiling / 2) <= backoff(attempt) <= ceiling
    assert 0.1 <= backoff(0, 0.1, 0.5) <= 0.1 and backoff(9, 0.1, 0.5) <= 0.5


async def test_only_mcp_envelopes_are_answered_in_the_link_session() -> None:
    """Other types and non-object payloads are ignored; replies carry the link's session id."""
    link = FakeLink([])
    device = Device(server(), link)
    for message in ({"type": "tts"}, {"type": "mcp", "payload": "x"}, request(1, "ping")):
        device.dispatch(message)
    await device.drain()
    assert link.sent == [{"session_id": "s", "type": "mcp",
                          "payload": {"jsonrpc": "2.0", "id": 1, "result": {}}}]  # fmt: skip


async def test_a_reply_over_the_link_limit_becomes_an_error_saying_so() -> None:
    """A result too big for the link is replaced by a -32603 error with the sizes."""
    link = FakeLink([])
    device = Device(server(), link)
    device.dispatch(request(4, "tools/call", name="self.big"))
    await device.drain()
    error = link.sent[0]["payload"]["error"]
    assert error["code"] == -32603 and error["message"].startswith("Reply too large: ")


async def test_tool_changes_are_sent_only_while_connected() -> None:
    """notify() sends the list_changed notification when connected, drops it otherwise."""
    link = FakeLink([])
    mcp = server()
    device = Device(mcp, link)
    mcp.add(Tool("self.a", "", (), lambda args: True))
    device.connected = True
    mcp.add(Tool("self.b", "", (), lambda args: True))
    await device.drain()
    assert [m["payload"]["method"] for m in link.sent] == ["notifications/tools/list_changed"]


async def test_run_retries_a_failed_open_then_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """run(): a refused open is retried after the backoff, then the session is served."""
    delays: list[int] = []
    monkeypatch.setattr(
        fw_device, "backoff", lambda attempt, low, high: delays.append(attempt) or 0
    )
    link = FakeLink([request(1, "ping")], fail=2)
    device = Device(server(), link, "dev")
    running = asyncio.create_task(device.run())
    async with asyncio.timeout(bound(5)):
        await link.ended.wait()
        await device.drain()
    running.cancel()
    async with asyncio.timeout(bound(5)):
        await asyncio.wait({running})
    assert link.opened == 3 and delays == [0, 1]
    assert link.sent[0]["payload"]["id"] == 1
    assert not device.connected and link.aborted == 1 and device.sessions == 1


async def test_restart_drops_the_link() -> None:
    """restart() aborts the link, as a board losing power drops its socket."""
    link = FakeLink([])
    Device(server(), link).restart()
    assert link.aborted == 1
