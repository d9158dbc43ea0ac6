"""The device side of MCP, with the stock xiaozhi firmware's semantics (xiaozhi-protocol.md §4).

Pure logic, no I/O: :meth:`DeviceMcpServer.handle` takes one parsed JSON-RPC message and returns
the reply, or None when a stock device would send nothing at all.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .cjson import MISSING, JsonObject, JsonValue, dumps, is_number, item, valueint
from .errors import INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, DeviceReboot, ToolError
from .simtool import SimTool, ToolResult

__all__ = ["PAGE_LIMIT", "DeviceMcpServer", "Vision"]

logger = logging.getLogger(__name__)

#: xiaozhi-protocol.md §4 "Pagination": the byte budget of one tools/list reply.
PAGE_LIMIT = 8000
_PAGE_SLACK = 30
_PAGE_HEAD = '{"tools":['


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
    """

    def __init__(
        self,
        tools: Iterable[SimTool] = (),
        *,
        board: str = "sim-esp32",
        fw_version: str = "2.4.2",
        error_codes: bool = False,
        ping: bool = False,
    ) -> None:
        self.board = board
        self.fw_version = fw_version
        self.error_codes = error_codes
        self.ping = ping
        self.vision: Vision | None = None
        self._tools: dict[str, SimTool] = {}
        for tool in tools:
            self.add_tool(tool)

    @property
    def tools(self) -> tuple[SimTool, ...]:
        """The registered tools, in listing order."""
        return tuple(self._tools.values())

    def add_tool(self, tool: SimTool) -> None:
        """Register ``tool`` after the existing ones.

        Raises:
            ValueError: a tool with that name is already registered.
        """
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name} is already registered")
        self._tools[tool.name] = tool

    def remove_tool(self, name: str) -> None:
        """Unregister the tool ``name``.

        Raises:
            KeyError: no such tool.
        """
        del self._tools[name]

    async def handle(self, payload: Mapping[str, object]) -> JsonObject | None:
        """Answer one JSON-RPC message; return the reply, or None to send nothing.

        Raises:
            DeviceReboot: a tool rebooted the device; like stock firmware, nothing is replied.
        """
        # xiaozhi-protocol.md §4: the checks run in this order, and each failure drops silently.
        if item(payload, "jsonrpc") != "2.0":
            return None
        method = item(payload, "method")
        if not isinstance(method, str) or method.startswith("notifications"):
            return None
        params = item(payload, "params")
        if params is not MISSING and not isinstance(params, dict):
            return None
        raw_id = item(payload, "id")
        if not is_number(raw_id):
            return None
        request_id = valueint(raw_id)
        try:
            result = await self._dispatch(method, params if isinstance(params, dict) else None)
        except ToolError as exc:
            return self._error(request_id, exc)
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    async def _dispatch(self, method: str, params: Mapping[str, object] | None) -> JsonObject:
        if method == "initialize":
            return self._initialize(params)
        if method == "tools/list":
            return self._list_tools(params)
        if method == "tools/call":
            return await self._call_tool(params)
        if method == "ping" and self.ping:
            return {}
        raise ToolError(f"Method not implemented: {method}", METHOD_NOT_FOUND)

    def _initialize(self, params: Mapping[str, object] | None) -> JsonObject:
        vision = item(item(params, "capabilities"), "vision")
        if isinstance(vision, dict):
            url, token = item(vision, "url"), item(vision, "token")
            if isinstance(url, str):
                self.vision = Vision(url, token if isinstance(token, str) else "")
        return {
            "protocolVersion": "2024-11-05",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": self.board, "version": self.fw_version},
        }

    def _list_tools(self, params: Mapping[str, object] | None) -> JsonObject:
        cursor = item(params, "cursor")
        with_user = item(params, "withUserTools")
        return self.page(cursor if isinstance(cursor, str) else "", with_user is True)

    def page(self, cursor: str = "", with_user_tools: bool = False) -> JsonObject:
        """Build one ``tools/list`` result exactly as stock firmware pages it.

        Listing restarts *at* the tool named ``cursor``; a tool is appended only while the page
        stays within :data:`PAGE_LIMIT` bytes (xiaozhi-protocol.md §4 "Pagination").

        Raises:
            ToolError: nothing fits (unknown cursor, or a single oversize tool).
        """
        tools: list[JsonValue] = []
        size = len(_PAGE_HEAD)
        next_cursor = ""
        found = not cursor
        for tool in self._tools.values():
            found = found or tool.name == cursor
            if not found or (tool.user_only and not with_user_tools):
                continue
            entry = tool.to_json()
            entry_size = len(dumps(entry).encode()) + len(",")
            if size + entry_size + _PAGE_SLACK > PAGE_LIMIT:
                next_cursor = tool.name
                break
            tools.append(entry)
            size += entry_size
        if not tools and self._tools:
            message = f"Failed to add tool {next_cursor} because of payload size limit"
            raise ToolError(message, INVALID_PARAMS if not next_cursor else INTERNAL_ERROR)
        result: JsonObject = {"tools": tools}
        if next_cursor:
            result["nextCursor"] = next_cursor
        return result

    async def _call_tool(self, params: Mapping[str, object] | None) -> JsonObject:
        if params is None:
            raise ToolError("Missing params", INVALID_PARAMS)
        name = item(params, "name")
        if not isinstance(name, str):
            raise ToolError("Missing name", INVALID_PARAMS)
        arguments = item(params, "arguments")
        if arguments is not MISSING and not isinstance(arguments, dict):
            raise ToolError("Invalid arguments", INVALID_PARAMS)
        tool = self._tools.get(name)
        if tool is None:
            raise ToolError(f"Unknown tool: {name}", INVALID_PARAMS)
        args = tool.parse_arguments(arguments if isinstance(arguments, dict) else None)
        try:
            value = await tool.handler(args)
        except (ToolError, DeviceReboot):
            raise
        except Exception as exc:
            # Stock firmware turns any std::exception from a tool into an error reply.
            logger.exception("tool %s failed", name)
            raise ToolError(str(exc) or type(exc).__name__, INTERNAL_ERROR) from exc
        return {"content": [{"type": "text", "text": _result_text(value)}], "isError": False}

    def _error(self, request_id: int, exc: ToolError) -> JsonObject:
        error: JsonObject = {"message": exc.message}
        if self.error_codes:
            error = {"code": exc.code, "message": exc.message}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _result_text(value: ToolResult) -> str:
    """Render a tool's return value as stock ``McpTool::Call`` does."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    return dumps(value)
