"""The list phase's baseline: a bare SDK server listing a fleet's tools, and the client.

The *baseline* (``listing_main``, in its own process) is a low-level SDK ``Server`` whose
``on_list_tools`` serves what the gateway lists in ``per-device`` mode for the same devices: the
gateway's four meta-tools, then per device the 25 catalogue tools (``_fleet_catalogue``) named
``<alias>_<tool>``, described ``[alias] ...``, with the same schema and annotations. They are
made once, at start, as ``types.Tool`` objects and cut into pages of at most the gateway's page
size (``PAGE_BYTES`` of tools as JSON, measured by serialising each tool); the cursor is the
page's index. It runs on uvicorn over stateful streamable HTTP at ``/mcp``, as the gateway does.

The *client* side (``list_all``) is the same for both: the official SDK ``Client`` in legacy
mode, ``tools/list`` page after page following ``next_cursor`` until none is left.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import mcp.types as types
import uvicorn
from _baseline import baseline_config
from _fleet_catalogue import TOOLS
from _processes import child_main, until_closed
from mcp import Client
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Route

from gateway.config import DeviceOptions
from gateway.devices.naming import derive_alias, tool_suffix
from gateway.devices.policy import tool_hints
from gateway.host_side.event_resources import WAIT_FOR_EVENT
from gateway.host_side.mcp_server import CALL_DEVICE_TOOL, LIST_DEVICES
from gateway.host_side.messages_tool import NOTIFY_DEVICE
from gateway.host_side.tool_listing import PAGE_BYTES

__all__ = ["BOARD", "PAGE_BYTES", "Listed", "list_all", "listing_main", "listing_tools"]

BOARD = "bench-board"  # the devices' serverInfo name, which the gateway names them after


def listing_tools(device_ids: list[str]) -> list[types.Tool]:
    """What the gateway lists in per-device mode for these devices (fresh gateway, in order)."""
    tools = [LIST_DEVICES, CALL_DEVICE_TOOL, WAIT_FOR_EVENT, NOTIFY_DEVICE]
    for device_id in device_ids:
        alias = derive_alias(device_id, BOARD)
        for tool in TOOLS:
            hints = tool_hints(tool["name"], DeviceOptions())
            tools.append(
                types.Tool(
                    name=f"{alias}_{tool_suffix(tool['name'])}",
                    description=f"[{alias}] {tool['description']}",
                    input_schema=tool["inputSchema"],
                    annotations=types.ToolAnnotations(
                        title=f"{alias}: {tool['name']}",
                        read_only_hint=hints.read_only,
                        destructive_hint=hints.destructive,
                    ),
                )
            )
    return tools


def _json_size(model: types.Tool | types.ListToolsResult) -> int:
    return len(model.model_dump_json(by_alias=True, exclude_none=True).encode())


def _pages(tools: list[types.Tool], limit: int) -> list[list[types.Tool]]:
    """The tools in pages whose tools take at most ``limit`` bytes as JSON (one tool at least)."""
    pages: list[list[types.Tool]] = [[]]
    size = 0
    for tool in tools:
        weight = _json_size(tool) + 1  # and its comma
        if size + weight > limit and pages[-1]:
            pages.append([])
            size = 0
        pages[-1].append(tool)
        size += weight
    return pages


def _server(pages: list[list[types.Tool]]) -> Server:
    async def list_tools(
        ctx: ServerRequestContext, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        cursor = params.cursor if params is not None else None
        index = int(cursor) if cursor and cursor.isdigit() and int(cursor) < len(pages) else 0
        following = str(index + 1) if index + 1 < len(pages) else None
        return types.ListToolsResult(tools=pages[index], next_cursor=following)

    return Server("bench-list-baseline", on_list_tools=list_tools)


async def _serve(conn: Connection, device_ids: list[str]) -> None:
    began = time.monotonic()
    tools = listing_tools(device_ids)
    pages = _pages(tools, PAGE_BYTES)
    built = time.monotonic() - began
    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    manager = StreamableHTTPSessionManager(app=_server(pages), security_settings=security)
    app = Starlette(routes=[Route("/mcp", endpoint=StreamableHTTPASGIApp(manager))])
    config = baseline_config(app)
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    async with manager.run():
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("the list baseline stopped while starting")
            await asyncio.sleep(0.01)
        port = sock.getsockname()[1]
        conn.send({"port": port, "tools": len(tools), "pages": len(pages), "build_s": built})
        await until_closed(conn)
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)


def listing_main(conn: Connection, device_ids: list[str]) -> None:
    """Entry point of the list baseline process: sends its port, serves until told to stop."""
    child_main(_serve(conn, device_ids))


# --- the client ----------------------------------------------------------------------------


@dataclass(slots=True)
class Listed:
    """One pass over a whole listing: its wall time, and what came back."""

    seconds: float = 0.0
    pages: int = 0
    tools: int = 0
    unique: int = 0  # distinct names: a paging bug would repeat or skip tools
    largest_bytes: int | None = None  # None when not measured
    total_bytes: int | None = None
    server_cpu_s: float = 0.0  # set by the caller, who knows the server
    names: set[str] = field(default_factory=set)


async def list_all(client: Client, *, sizes: bool = False, names: bool = False) -> Listed:
    """Fetch every page, following ``next_cursor``; time only the requests.

    With ``sizes``, each page is serialised again (outside the timing) for the largest and
    total result bytes. With ``names``, the tool names are kept.
    """
    listed, seen = Listed(), set[str]()
    cursor: str | None = None
    while True:
        began = time.perf_counter()
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        listed.seconds += time.perf_counter() - began
        listed.pages += 1
        listed.tools += len(page.tools)
        seen.update(tool.name for tool in page.tools)
        if sizes:
            size = _json_size(page)
            listed.largest_bytes = max(listed.largest_bytes or 0, size)
            listed.total_bytes = (listed.total_bytes or 0) + size
        cursor = page.next_cursor
        if cursor is None:
            break
    listed.unique = len(seen)
    if names:
        listed.names = seen
    return listed


def pass_figures(listed: Listed) -> dict[str, Any]:
    """A pass as JSON figures (without the names)."""
    figures: dict[str, Any] = {
        "seconds": round(listed.seconds, 3),
        "pages": listed.pages,
        "tools": listed.tools,
        "unique": listed.unique,
        "server_cpu_s": round(listed.server_cpu_s, 2),
    }
    if listed.largest_bytes is not None:
        figures["largest_page_bytes"] = listed.largest_bytes
        figures["total_bytes"] = listed.total_bytes
    return figures
