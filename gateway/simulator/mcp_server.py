"""The device side of MCP: the firmware's own server (device_fw/fw_mcp.py) behind a typed face.

:class:`DeviceMcpServer` keeps the :class:`~gateway.simulator.simtool.SimTool` declarations and
hands each to the firmware's ``McpServer``, which answers every message exactly as a board does:
stock xiaozhi semantics (docs/protocol.md §4), with error codes, ``ping`` and
``listChanged`` as options.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from device_fw.fw_mcp import PAGE_LIMIT, McpServer

from .simtool import JsonObject, SimTool

__all__ = ["PAGE_LIMIT", "DeviceMcpServer", "Vision"]


@dataclass(frozen=True, slots=True)
class Vision:
    """The camera-explain endpoint a client passed in ``initialize`` (``capabilities.vision``)."""

    url: str
    token: str


class DeviceMcpServer:
    """The MCP server of one simulated device.

    Args:
        tools: the tools, in registration (and listing) order.
        board: ``serverInfo.name`` (stock: ``BOARD_NAME``).
        fw_version: ``serverInfo.version``.
        error_codes: add JSON-RPC ``code`` to errors, as our firmware does (stock sends none).
        ping: answer ``ping`` with ``{}`` as our firmware does (stock: "Method not implemented").
        list_changed: announce ``listChanged`` and notify tool changes (stock does neither).
    """

    def __init__(
        self,
        tools: Iterable[SimTool] = (),
        *,
        board: str = "sim-esp32",
        fw_version: str = "2.4.2",
        error_codes: bool = False,
        ping: bool = False,
        list_changed: bool = True,
    ) -> None:
        #: The firmware's server; a device sets its ``listener`` to send notifications.
        self.firmware = McpServer(
            board, fw_version, codes=error_codes, ping=ping, list_changed=list_changed
        )
        self._tools: dict[str, SimTool] = {}
        for tool in tools:
            self.add_tool(tool)

    @property
    def board(self) -> str:
        """``serverInfo.name``."""
        return self.firmware.name

    @property
    def tools(self) -> tuple[SimTool, ...]:
        """The registered tools, in listing order."""
        return tuple(self._tools.values())

    @property
    def vision(self) -> Vision | None:
        """What the last ``initialize`` passed as ``capabilities.vision``, if anything."""
        vision = self.firmware.vision
        return None if vision is None else Vision(*vision)

    def add_tool(self, tool: SimTool) -> None:
        """Register ``tool`` after the existing ones (the firmware notifies the change).

        Raises:
            ValueError: a tool with that name is already registered.
        """
        self.firmware.add(tool.to_firmware())
        self._tools[tool.name] = tool

    def remove_tool(self, name: str) -> None:
        """Unregister the tool ``name`` (the firmware notifies the change).

        Raises:
            KeyError: no such tool.
        """
        self.firmware.remove(name)
        del self._tools[name]

    async def handle(self, payload: Mapping[str, object]) -> JsonObject | None:
        """Answer one JSON-RPC message; return the reply, or None to send nothing.

        Raises:
            DeviceReboot: a tool rebooted the device; like stock firmware, nothing is replied.
        """
        reply: JsonObject | None = await self.firmware.handle(dict(payload))
        return reply

    def page(self, cursor: str = "", with_user_tools: bool = False) -> JsonObject:
        """Build one ``tools/list`` result as the firmware pages it (8000-byte pages).

        Raises:
            ToolError: nothing fits (unknown cursor, or a single oversize tool).
        """
        listing: JsonObject = self.firmware.page(cursor, with_user_tools)
        return listing
