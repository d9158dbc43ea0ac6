"""In-memory stand-ins for a connected device, for tests above the transport layer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from gateway.config import Config
from gateway.devices.audit import AuditLog
from gateway.devices.calls import CallRouter
from gateway.devices.decisions import ToolDecisions
from gateway.devices.link import LinkClosed
from gateway.devices.registry import DeviceAdmin, DeviceRegistry, KnownDevices
from gateway.devices.store import Store
from gateway.host_side.mcp_server import McpFrontend

JsonObject = dict[str, Any]


def tool(name: str, **schema: Any) -> JsonObject:
    """A device tool as DeviceProtocol hands it over."""
    spec: JsonObject = {"name": name, "description": f"does {name}",
                        "inputSchema": {"type": "object", "properties": schema}}  # fmt: skip
    return spec


class ScriptedSession:
    """A DeviceSession whose answers the test decides."""

    send_frame = None

    def __init__(self, answer: Callable[[str, JsonObject], JsonObject] | None = None) -> None:
        self.calls: list[tuple[str, JsonObject]] = []
        self._answer = answer or (lambda name, args: {"content": [{"type": "text", "text": "ok"}]})
        self.closed = False

    async def call(self, tool: str, arguments: JsonObject) -> JsonObject:
        self.calls.append((tool, arguments))
        return self._answer(tool, arguments)

    async def aclose(self) -> None:
        self.closed = True


class Stack:
    """Registry, router and MCP frontend over one data dir, as the Gateway wires them."""

    def __init__(
        self,
        config: Config,
        clock: Callable[[], float] | None = None,
        decisions: ToolDecisions | None = None,
    ) -> None:
        self.config = config
        self.store = Store(config.data_dir / "registry.sqlite3")
        self.audit = AuditLog(config.data_dir / "audit.log")
        known = KnownDevices(config, self.store, clock or time.time, self.audit, decisions)
        self.registry = DeviceRegistry(known, DeviceAdmin(known))
        self.router = CallRouter(config, self.audit)
        self.frontend = McpFrontend(config, self.registry.known, self.router)

    def close(self) -> None:
        self.audit.close()
        self.store.close()


def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


class MemoryLink:
    """An in-memory ``DeviceLink``: the test speaks as the device through ``feed``/``sent``."""

    sends_whole = pushes = False
    fail = None

    def __init__(self) -> None:
        self.closed = False
        self._inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self._outbox: asyncio.Queue[JsonObject] = asyncio.Queue()

    def feed(self, message: JsonObject) -> None:
        """The device sends ``message``."""
        self._inbox.put_nowait(json.dumps(message))

    async def next_sent(self) -> JsonObject:
        """The next message the gateway sent (waits, bounded by the caller)."""
        return await self._outbox.get()

    async def send(self, text: str) -> None:
        if self.closed:
            raise LinkClosed("closed")
        self._outbox.put_nowait(json.loads(text))

    async def __aiter__(self) -> AsyncIterator[str]:
        while (text := await self._inbox.get()) is not None:
            yield text

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self._inbox.put_nowait(None)
