"""A simulated ESP32 that runs the real firmware code (device_fw/) on CPython.

The WebSocket client (``fw_ws``), the stock handshake and hello (``fw_link_ws``,
docs/protocol.md §1), the serving loop with its reconnect backoff (``fw_device``) and the MCP
server (``fw_mcp``, §4) are the very modules a board runs; this class adds what tests and the
``simulate`` command need around them: a typed API, a record of the calls, and stock-like
options (no error codes, no ping, no keepalive pings).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Self

from device_fw.fw_device import Device, backoff
from device_fw.fw_events import Events
from device_fw.fw_link_ws import HelloError, WsLink
from device_fw.fw_ws import HandshakeError

from .errors import DeviceReboot, HandshakeRefused, HelloFailed
from .mcp_server import DeviceMcpServer
from .simtool import JsonObject, SimTool
from .tools import BoardState, camera_tool, default_tools

__all__ = ["HOT", "SimulatedDevice", "backoff_delay", "persistent_client_id"]

HOT = 30.0  # °C: above it the simulated temperature sensor raises its alarm event

logger = logging.getLogger(__name__)


def persistent_client_id(device_id: str) -> str:
    """The Client-Id a simulated board keeps for life: one per device id, like stock's NVS."""
    digest = hashlib.sha256(f"esp-mcp-gateway-simulator:{device_id.lower()}".encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))  # v4 in form, as stock makes them


class _Firmware(Device):
    """The firmware's device runtime, plus a record of every ``tools/call`` it receives."""

    def __init__(self, simulated: SimulatedDevice, link: WsLink) -> None:
        super().__init__(simulated.mcp.firmware, link, tag=simulated.device_id)
        self._simulated = simulated

    def dispatch(self, message: dict[str, Any]) -> None:
        payload = message.get("payload")
        if message.get("type") == "mcp" and isinstance(payload, dict):
            self._simulated.record_call(payload)
        super().dispatch(message)

    async def answer(self, payload: dict[str, Any]) -> None:
        try:
            await super().answer(payload)
        except DeviceReboot:
            # docs/protocol.md §4 "Concurrency": stock reboots before it replies.
            logger.warning("[%s] rebooting: the call gets no reply", self.tag)
            self.link.abort()


class SimulatedDevice:
    """One simulated device: connects, says hello, serves MCP.

    Use it as an async context manager (connected inside the block) or run
    :meth:`run_forever`, which reconnects until cancelled.

    Args:
        url: the gateway's device WebSocket, e.g. ``ws://127.0.0.1:8765/xiaozhi/v1/``.
        token: the device token, sent as ``Authorization: Bearer <token>``; None sends none.
        device_id: the MAC address sent as ``Device-Id`` (lowercased, as stock).
        board: the board name, reported as ``serverInfo.name``.
        tools: the tools to serve; None means the default catalogue on a fresh board.
        error_codes: send JSON-RPC error codes (our firmware) instead of none (stock).
        list_changed: announce tool changes with ``notifications/tools/list_changed``.
        ping: answer MCP ``ping`` (our firmware) instead of "Method not implemented" (stock).
        keepalive: seconds between the firmware's WebSocket pings; None never pings (stock).
        camera: a camera board: ``self.camera.take_photo`` uploads a generated JPEG to the
            vision URL of ``initialize`` (after the common tools, or after ``tools``).
        clock: the millisecond clock the firmware's event rate reads (``fw_events``); tests
            pass their own.

    Events (docs/events.md) go through the firmware's own API: :meth:`press` for a button,
    :meth:`sense` for the temperature sensor; :attr:`events` is that API.
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        device_id: str = "02:00:00:00:00:01",
        board: str = "sim-esp32",
        tools: Iterable[SimTool] | None = None,
        error_codes: bool = False,
        list_changed: bool = True,
        ping: bool = False,
        keepalive: float | None = None,
        camera: bool = False,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.url = url
        self.device_id = device_id.lower()
        # Stock firmware generates its Client-Id once and keeps it in NVS (§1): the same board
        # always presents the same one, which the gateway binds its id to on approval.
        self.client_id = persistent_client_id(self.device_id)
        self.board = BoardState(device_id=self.device_id, client_id=self.client_id, board=board)
        photo = camera_tool(self.board, lambda: self.mcp.firmware.vision) if camera else None
        if tools is None:
            catalogue = default_tools(self.board, photo)
        else:
            catalogue = [*tools, *([photo] if photo is not None else [])]
        self.mcp = DeviceMcpServer(
            catalogue, board=board, error_codes=error_codes, ping=ping, list_changed=list_changed
        )
        self.link = WsLink(url, token, self.device_id, self.client_id, keepalive)
        self.firmware = _Firmware(self, self.link)
        self.events = self.firmware.events = Events(self.firmware.notify, clock=clock)
        #: Every ``tools/call`` received, as (tool name, raw arguments), in arrival order.
        self.calls: list[tuple[str, JsonObject]] = []
        self._serving: asyncio.Task[None] | None = None
        self._call_seen = asyncio.Event()

    @property
    def session_id(self) -> str:
        """The session id from the last server hello ("" before any)."""
        return self.link.session_id

    @property
    def connected(self) -> bool:
        """Whether the device is connected, past the hello and serving."""
        return self.firmware.connected

    async def __aenter__(self) -> Self:
        """Connect, exchange hellos and start serving in a background task.

        Raises:
            HandshakeRefused: the gateway answered the upgrade with an HTTP error status.
            HelloFailed: no acceptable server hello within 10 s.
            OSError: the gateway could not be reached.
        """
        try:
            await self.link.open()
        except HandshakeError as exc:
            raise HandshakeRefused(self.url, exc.status) from exc
        except HelloError as exc:
            raise HelloFailed(str(exc)) from exc
        # Connected from now on, not from when the serving task first runs: a tool added
        # right away is announced (serve() sets the same flag when it starts).
        self.firmware.connected = True
        name = f"simulator[{self.device_id}].serve"
        self._serving = asyncio.create_task(self.firmware.serve(), name=name)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the connection with a close frame and wait for serving to end."""
        await self.link.close()
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Wait until the connection is gone (closed by either side, dropped, or rebooted).

        Cancelling this wait (a timeout, say) leaves the device connected.
        """
        serving = self._serving
        if serving is None:
            return
        await asyncio.wait({serving})
        if not serving.cancelled():
            serving.result()  # re-raise what broke the serving task, if anything did

    async def drop(self) -> None:
        """Vanish like a device losing power: close the TCP connection without a close frame."""
        self.link.abort()
        await self.wait_closed()

    # A timeout parameter on purpose: every test wait must be bounded, so the bound is built in.
    async def wait_for_call(
        self,
        name: str,
        timeout: float = 5.0,  # noqa: ASYNC109
        *,
        start: int = 0,
    ) -> JsonObject:
        """Wait for a ``tools/call`` of ``name`` and return its arguments.

        Calls already received count: the first match at index ``start`` or later in
        :attr:`calls` is returned.

        Raises:
            TimeoutError: no such call within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while True:
                for tool, arguments in self.calls[start:]:
                    if tool == name:
                        return arguments
                await self._call_seen.wait()

    async def add_tool(self, tool: SimTool) -> None:
        """Register ``tool``; the firmware announces it if connected and ``list_changed``.

        Raises:
            ValueError: a tool with that name is already registered.
        """
        self.mcp.add_tool(tool)

    async def remove_tool(self, name: str) -> None:
        """Unregister the tool ``name``; the firmware announces it like :meth:`add_tool`.

        Raises:
            KeyError: no such tool.
        """
        self.mcp.remove_tool(name)

    def press(self, button: str = "button") -> bool:
        """Press the board's ``button``: event ``button.<name>``; False if the rate dropped it."""
        return self.events.press(button)

    def sense(self) -> int:
        """Read the temperature sensor once: event ``sensor.temperature`` when the reading moved
        by more than 0.2 °C, and ``alarm.temperature`` when it crosses ``HOT`` (back below it
        1 °C lower). Returns how many events went."""
        celsius = self.board.read_temperature()
        sent = self.events.reading("sensor.temperature", celsius, delta=0.2, unit="°C")
        alarm = self.events.threshold("alarm.temperature", celsius, HOT, hysteresis=1.0,
                                      unit="°C")  # fmt: skip
        return int(sent) + int(alarm)

    async def run_forever(self) -> None:
        """Stay connected until cancelled: the firmware's own loop (``fw_device.Device.run``).

        It reconnects after a drop, a reboot or a refusal, backing off exponentially with
        jitter from 1 s to 30 s; a session that got as far as the hello resets the backoff.
        """
        await self.firmware.run()

    def record_call(self, payload: dict[str, Any]) -> None:
        """Add the call ``payload`` makes to ``calls``, if it is a ``tools/call``."""
        params = payload.get("params")
        if payload.get("method") != "tools/call" or not isinstance(params, dict):
            return
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str):
            return
        self.calls.append((name, arguments if isinstance(arguments, dict) else {}))
        self._call_seen.set()
        self._call_seen = asyncio.Event()


def backoff_delay(attempt: int) -> float:
    """Return the seconds to wait before reconnect attempt ``attempt`` (0-based).

    The firmware's own rule (``fw_device.backoff``): the ceiling doubles from 1 s up to 30 s,
    and the delay is jittered down to half of it, never below 1 s, so that a fleet restarted
    together does not reconnect in lockstep.
    """
    return backoff(attempt)
