import asyncio
from collections.abc import Callable
from typing import Any

from .fw_envelope import ToolError as ToolError
from .fw_tool import Prop as Prop
from .fw_tool import Tool as Tool

__all__ = ["McpServer", "Prop", "Tool", "ToolError"]

PAGE_LIMIT: int
CANCELLED: str
CAMERA: str

class McpServer:
    name: str
    version: str
    codes: bool
    ping: bool
    list_changed: bool
    page_limit: int
    tools: list[Tool]
    vision: tuple[str, str] | None
    listener: Callable[[dict[str, Any]], None] | None
    running: dict[Any, asyncio.Task[Any]]
    def __init__(
        self,
        name: str,
        version: str,
        codes: bool = True,
        ping: bool = True,
        list_changed: bool = True,
    ) -> None: ...
    def find(self, name: str) -> Tool | None: ...
    def add(self, tool: Tool) -> Tool: ...
    def remove(self, name: str) -> None: ...
    async def handle(self, msg: dict[str, Any]) -> dict[str, Any] | None: ...
    def cancel(self, rid: object) -> bool: ...
    def page(self, cursor: str = "", with_user: bool = False) -> dict[str, Any]: ...
