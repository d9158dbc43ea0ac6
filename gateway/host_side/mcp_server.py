"""The MCP server hosts talk to: device tools, meta-tools, and ``tools/list_changed`` fan-out.

Built on the SDK's low-level ``Server``; transports (stdio, SSE, streamable HTTP) are mounted
elsewhere (``gateway.host_side.http``, ``gateway.app``). Every device failure becomes an ``isError``
result with a clear text: SDK 2.x turns any other exception into an opaque -32603.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
from typing import Any

import mcp.types as types
from mcp import MCPError
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.caching import CacheHint
from mcp.server.context import CallNext, HandlerResult
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp.types.version import MODERN_PROTOCOL_VERSIONS

from gateway import __version__
from gateway.config import Config
from gateway.devices.calls import CallRouter
from gateway.devices.photos import PhotoStore, alias_of
from gateway.devices.registry import Device, DeviceRegistry, DeviceTool
from gateway.errors import CallRejected, DeviceError
from gateway.host_side.device_listing import STATES, DeviceQuery, list_devices
from gateway.host_side.photo_resources import PhotoResources
from gateway.host_side.tool_listing import ToolGroup, ToolLister

__all__ = ["ChangeNotifier", "GatewayServer", "McpFrontend", "resolve_tool"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Context = ServerRequestContext[Any, Any]

INSTRUCTIONS = (
    "Tools of physical ESP32 devices. Each device tool is named <device>_<tool>; its description "
    "starts with [<device>]. list_devices shows every device, whether it is online, and its "
    "tools; call_device_tool calls any of them by device and tool name (use it when a device's "
    "tools are not listed individually)."
)

LIST_DEVICES = types.Tool(
    name="list_devices",
    title="List devices",
    description="List the known ESP32 devices, whether each is online, and the tools each "
    "offers (with their argument schemas). Filter by name or board (globs such as kitchen*) "
    "and state; a long list comes in pages: pass next_cursor back as cursor for the next.",
    input_schema={
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "glob on the device name or id"},
            "state": {"type": "string", "enum": list(STATES)},
            "board": {"type": "string", "description": "glob on the board name"},
            "cursor": {"type": "string", "description": "next_cursor of the previous page"},
        },
        "additionalProperties": False,
    },
    annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False),
)

CALL_DEVICE_TOOL = types.Tool(
    name="call_device_tool",
    title="Call a device tool",
    description="Call a tool of one device. `device` is the device name (or id) and `tool` the "
    "tool's name, both as list_devices shows them; `arguments` follows the tool's schema.",
    input_schema={
        "type": "object",
        "properties": {
            "device": {"type": "string", "description": "device name or id"},
            "tool": {"type": "string", "description": "tool name, e.g. self.lamp.turn_on"},
            "arguments": {"type": "object", "description": "the tool's arguments"},
        },
        "required": ["device", "tool"],
    },
    annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
)

_META_TOOLS = tuple(  # first on page one, in wire form like the device tools after them
    tool.model_dump(by_alias=True, mode="json", exclude_none=True)
    for tool in (LIST_DEVICES, CALL_DEVICE_TOOL)
)


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[_text(text)], is_error=True)


class GatewayServer(Server[Any]):
    """A ``Server`` that advertises ``tools.listChanged`` on every handshake-era transport.

    The streamable-HTTP manager calls ``serve_loop()`` without init options, which would default
    to ``listChanged=false`` (reference/mcp-sdk-2x.md §2.3).
    """

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        """Default to ``tools_changed=True``."""
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )


class ChangeNotifier:
    """Tells every connected MCP session that the tool list changed.

    Handshake-era sessions get ``notifications/tools/list_changed`` on their standalone channel;
    2026-era clients get it on their ``subscriptions/listen`` stream. SDK 2.x builds a new
    ``ServerSession`` proxy per message, so sessions are keyed by their private ``_connection``
    (pinned by ``mcp==2.3.*`` and by the end-to-end tests), captured once per connection at
    ``notifications/initialized`` and dropped by the connection's exit stack.
    """

    def __init__(self) -> None:
        self._legacy: dict[int, ServerSession] = {}
        self._sessions_changed = asyncio.Event()
        self.bus = InMemorySubscriptionBus()
        self.listen_handler = ListenHandler(self.bus)

    async def __call__(self, ctx: Context, call_next: CallNext) -> HandlerResult:
        """Server middleware: remember each handshake-era connection once it is initialized."""
        result = await call_next(ctx)
        if (
            ctx.method == "notifications/initialized"
            and ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
        ):
            self._track(ctx.session)
        return result

    def _track(self, session: ServerSession) -> None:
        connection = getattr(session, "_connection", None)
        if connection is None or not getattr(connection, "has_standalone_channel", True):
            return  # stateless HTTP: there is nowhere to push to
        key = id(connection)
        if key not in self._legacy:
            self._legacy[key] = session
            connection.exit_stack.callback(self._forget, key)
            self._signal()

    def _forget(self, key: int) -> None:
        self._legacy.pop(key, None)
        self._signal()

    def _signal(self) -> None:
        self._sessions_changed.set()
        self._sessions_changed = asyncio.Event()

    @property
    def session_count(self) -> int:
        """How many handshake-era sessions would be told of a change now."""
        return len(self._legacy)

    async def wait_for_sessions(self, count: int) -> None:
        """Wait until exactly ``count`` handshake-era sessions are connected."""
        while len(self._legacy) != count:
            await self._sessions_changed.wait()

    async def tools_changed(self) -> None:
        """Notify every session; a session that went away is skipped, never fatal."""
        for session in list(self._legacy.values()):
            with contextlib.suppress(Exception):
                await session.send_tool_list_changed()
        await self.bus.publish(ToolsListChanged())


class McpFrontend:
    """The gateway's MCP face: builds the ``Server`` and answers its requests."""

    def __init__(
        self,
        config: Config,
        registry: DeviceRegistry,
        router: CallRouter,
        photos: PhotoStore | None = None,
        *,
        notify_window: float = 0.2,
    ) -> None:
        self._config = config
        self._notify_window = notify_window
        self._registry = registry
        self._router = router
        self.notifier = ChangeNotifier()
        self.lister = ToolLister(config, registry)
        resources = PhotoResources(registry, photos) if photos is not None else None
        self.server = GatewayServer(
            "esp-mcp-gateway",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_call_tool=self._call_tool,
            # Without it, the SDK would page through the whole tools/list to find the schema of
            # each 2026-era call over HTTP (101 pages per call at 1,000 devices).
            get_tool_input_schema=self.input_schema,
            on_subscriptions_listen=self.notifier.listen_handler,
            **(_resource_handlers(resources) if resources is not None else {}),
            # 2026-era clients may reuse a list this long; tools/list_changed says when sooner.
            cache_hints={"tools/list": CacheHint(ttl_ms=60_000, scope="private")},
        )
        # Registered by method rather than as on_list_tools: the handler answers in wire form
        # (a dict, which the SDK validates as it would a model), so that no SDK Tool model is
        # made per device tool per request (gateway/host_side/tool_listing.py).
        self.server.add_request_handler(
            "tools/list", types.PaginatedRequestParams, self._list_tools
        )
        self.server.middleware.append(self.notifier)

    async def forward_changes(self) -> None:
        """Push registry changes to every MCP session (runs for the gateway's life).

        Changes that come within ``notify_window`` of each other go out as one notification, so
        a storm of joins costs hosts a bounded number of refetches.
        """
        async with self._registry.changes() as changes:
            async for _ in changes:
                await asyncio.sleep(self._notify_window)  # let the rest of a storm fold in
                await self.notifier.tools_changed()

    def tools(self, cursor: str | None = None) -> tuple[list[JsonObject], str | None]:
        """One page of the tool list hosts see (wire form), and the cursor of the next.

        The first page starts with the meta-tools, always there whatever the mode.
        """
        device_tools, first, following = self.lister.page(cursor)
        return [*_META_TOOLS, *device_tools] if first else device_tools, following

    def input_schema(self, name: str) -> JsonObject | None:
        """The ``inputSchema`` tool ``name`` is listed with, if it is listed."""
        for meta in _META_TOOLS:
            if meta["name"] == name:
                return dict(meta["inputSchema"])
        return self.lister.input_schema(name)

    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> JsonObject:
        tools, following = self.tools(params.cursor if params is not None else None)
        # What a ListToolsResult dumps to: 2026-era sessions require resultType (the SDK's
        # check of the result drops it for older ones; the cache hint fills ttlMs, cacheScope).
        result: JsonObject = {"tools": tools, "resultType": "complete"}
        if following is not None:
            result["nextCursor"] = following
        return result

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == LIST_DEVICES.name:
            try:
                answer = list_devices(self._registry, DeviceQuery(arguments))
            except ValueError as exc:
                return _error(f"list_devices: {exc}")
            return types.CallToolResult(content=[_text(json.dumps(answer))])
        if params.name == CALL_DEVICE_TOOL.name:
            return await self._call_by_reference(ctx, arguments)
        group = self.lister.group(params.name)
        if group is not None:
            return await self._call_grouped(ctx, group, arguments)
        exposed = self._registry.lookup(params.name)  # per-device names work in every mode
        if exposed is None:  # the spec's answer to an unknown tool: a protocol error
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        return await self._invoke(ctx, exposed, arguments)

    async def _call_grouped(
        self, ctx: Context, group: ToolGroup, arguments: JsonObject
    ) -> types.CallToolResult:
        arguments = dict(arguments)
        ref = arguments.pop(group.argument, None)
        if not isinstance(ref, str):
            return _error(f"{group.name} needs `{group.argument}`: which device to use")
        tool = group.member(ref)
        if tool is None:
            known = ", ".join(group.aliases(20)) + (", ..." if len(group.members) > 20 else "")
            return _error(f"no device {ref!r} offers {group.name} (devices that do: {known})")
        return await self._invoke(ctx, tool, arguments)

    async def _call_by_reference(self, ctx: Context, arguments: JsonObject) -> types.CallToolResult:
        device_ref, tool_ref = arguments.get("device"), arguments.get("tool")
        tool_arguments = arguments.get("arguments") or {}
        if not isinstance(device_ref, str) or not isinstance(tool_ref, str):
            return _error("call_device_tool needs string `device` and `tool` arguments")
        if not isinstance(tool_arguments, dict):
            return _error("call_device_tool: `arguments` must be an object")
        device = self._registry.find(device_ref)
        if device is None:
            known = ", ".join(d.alias for d in self._registry.devices()) or "none"
            return _error(f"unknown device {device_ref!r} (known devices: {known})")
        tool = resolve_tool(self._registry, device, tool_ref)
        if isinstance(tool, str):
            return _error(tool)
        return await self._invoke(ctx, tool, tool_arguments)

    async def _invoke(
        self, ctx: Context, tool: DeviceTool, arguments: JsonObject
    ) -> types.CallToolResult:
        try:
            result = await self._router.call(tool, arguments, caller=_caller(ctx))
        except (CallRejected, DeviceError) as exc:
            return _error(str(exc))
        return to_call_result(result)


def _resource_handlers(resources: PhotoResources) -> dict[str, Any]:
    async def list_resources(
        ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return resources.list(params.cursor if params is not None else None)

    async def list_templates(
        ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return resources.templates()

    async def read_resource(
        ctx: Context, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        return await resources.read(str(params.uri))

    return {
        "on_list_resources": list_resources,
        "on_list_resource_templates": list_templates,
        "on_read_resource": read_resource,
    }


def resolve_tool(registry: DeviceRegistry, device: Device, ref: str) -> DeviceTool | str:
    """The device's tool named ``ref`` (its own name, without ``self.``, or its MCP name).

    Returns a clear message instead when there is no such tool.
    """
    tool = device.tool(ref) or device.tool("self." + ref)
    exposed = registry.lookup(ref)
    if tool is None and exposed is not None and exposed.device is device:
        tool = exposed
    if tool is not None:
        return tool
    rejected = next((r for r in device.rejected if r.tool in (ref, "self." + ref)), None)
    if rejected is not None:
        return f"device {device.alias}: tool {rejected.tool!r} was rejected: {rejected.reason}"
    return f"device {device.alias} has no tool {ref!r}"


def _caller(ctx: Context) -> str:
    request = ctx.request
    client = getattr(request, "client", None)
    where = f"http:{client.host}" if client is not None else "stdio"
    params = ctx.session.client_params
    return f"{where} {params.client_info.name}" if params is not None else where


def to_call_result(result: JsonObject) -> types.CallToolResult:
    """Turn a device's ``tools/call`` result into the MCP result hosts get."""
    items = result.get("content")
    content = [_content(item) for item in items] if isinstance(items, list) else []
    structured = result.get("structuredContent")
    return types.CallToolResult(
        content=content,
        structured_content=structured if isinstance(structured, dict) else None,
        is_error=result.get("isError") is True,
    )


def _content(item: object) -> types.ContentBlock:
    if isinstance(item, dict):
        if item.get("type") == "text" and isinstance(item.get("text"), str):
            return _text(item["text"])
        if item.get("type") == "image":
            image = _image(item)
            if image is not None:
                return image
        # Links to the gateway's own resources (a photo); a device's link elsewhere stays text.
        if item.get("type") == "resource_link" and alias_of(str(item.get("uri"))) is not None:
            with contextlib.suppress(ValueError):  # pydantic's ValidationError is a ValueError
                return types.ResourceLink.model_validate(item)
    return _text(json.dumps(item, ensure_ascii=False))


def _image(item: JsonObject) -> types.ImageContent | None:
    # docs/protocol.md §4: stock firmware's image content nests a JSON *string* under "image".
    if isinstance(item.get("image"), str):
        try:
            item = json.loads(item["image"])
        except ValueError:
            return None
        if not isinstance(item, dict):
            return None
    data, mime = item.get("data"), item.get("mimeType", "image/jpeg")
    if not isinstance(data, str) or not isinstance(mime, str):
        return None
    try:
        base64.b64decode(data, validate=True)
    except binascii.Error:
        return None
    return types.ImageContent(type="image", data=data, mime_type=mime)
