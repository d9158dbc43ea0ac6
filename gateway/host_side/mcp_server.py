"""The MCP server hosts talk to: device tools, meta-tools, and ``tools/list_changed`` fan-out.

Built on the SDK's low-level ``Server``; transports (stdio, SSE, streamable HTTP) are mounted
elsewhere (``gateway.host_side.http``, ``gateway.app``). Every device failure becomes an ``isError``
result with a clear text: SDK 2.x turns any other exception into an opaque -32603.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from typing import Any

import mcp.types as types
from mcp import MCPError
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ResourcesListChanged,
    ToolsListChanged,
)
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import trace

from gateway import __version__
from gateway.compat.mcp_sdk import session_connection
from gateway.config import Config
from gateway.devices.audit import AuditLog
from gateway.devices.calls import CallRouter
from gateway.devices.events import EventStore, approved_in
from gateway.devices.messages import Messenger
from gateway.devices.photos import PhotoStore
from gateway.devices.registry import Device, DeviceTool, DeviceView
from gateway.errors import CallRejected, DeviceError
from gateway.host_side import confirm_asks as asks
from gateway.host_side.call_results import call_result, text_content
from gateway.host_side.callers import Caller, caller_of
from gateway.host_side.channels import Channels
from gateway.host_side.device_listing import STATES, DeviceQuery, list_devices
from gateway.host_side.device_scope import DeviceScope
from gateway.host_side.event_resources import TEMPLATES as EVENT_TEMPLATES
from gateway.host_side.event_resources import WAIT_FOR_EVENT, EventResources
from gateway.host_side.fleet_app import PANEL, FleetApp, advertised
from gateway.host_side.messages_tool import NOTIFY_DEVICE, notify_device
from gateway.host_side.photo_resources import RESOURCE_NOT_FOUND, PhotoResources
from gateway.host_side.tool_listing import ToolGroup, ToolLister

__all__ = ["ChangeNotifier", "GatewayServer", "McpFrontend", "resolve_tool"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Context = ServerRequestContext[Any, Any]
CallAnswer = types.CallToolResult | types.InputRequiredResult | JsonObject  # dict: wire form

INSTRUCTIONS = (
    "Tools of physical ESP32 devices. Each device tool is named <device>_<tool>; its description "
    "starts with [<device>]. list_devices shows every device, whether it is online, and its "
    "tools; call_device_tool calls any of them by device and tool name (use it when a device's "
    "tools are not listed individually); notify_device shows a short message on a device."
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


def _wire(tool: types.Tool) -> JsonObject:
    """``tool`` as ``tools/list`` lists it (the device tools are made in this form)."""
    return tool.model_dump(by_alias=True, mode="json", exclude_none=True)


_META_TOOLS = tuple(  # page one
    _wire(tool) for tool in (LIST_DEVICES, CALL_DEVICE_TOOL, WAIT_FOR_EVENT, NOTIFY_DEVICE)
)


def _tracing() -> bool:
    """Whether an OpenTelemetry tracer provider is installed (``opentelemetry-instrument``, or
    the embedding program's): the SDK's spans then go somewhere."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[text_content(text)], is_error=True)


class GatewayServer(Server[Any]):
    """A ``Server`` that advertises ``tools.listChanged`` and ``resources.listChanged`` on every
    handshake-era transport.

    The streamable-HTTP manager calls ``serve_loop()`` without init options, which would default
    to ``listChanged=false`` (reference/mcp-sdk-2x.md §2.3).
    """

    def create_initialization_options(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        """Default to ``tools_changed=True`` and ``resources_changed=True``."""
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True, resources_changed=True),
            experimental_capabilities,
            extensions,
        )


class ChangeNotifier:
    """Tells every connected MCP session that the tool (or resource) list changed.

    Handshake-era sessions get ``notifications/tools/list_changed`` on their standalone channel;
    2026-era clients get it on their ``subscriptions/listen`` stream. SDK 2.x builds a new
    ``ServerSession`` proxy per message, so sessions are keyed by their private ``_connection``
    (pinned by ``mcp==2.3.*`` and by the end-to-end tests), captured once per connection at
    ``notifications/initialized`` and dropped by the connection's exit stack.

    It is that notification's handler, not a server middleware: a middleware would wrap every
    message of every session (each tool call) to look for this one.
    """

    def __init__(self) -> None:
        self._legacy: dict[int, ServerSession] = {}
        self._sessions_changed = asyncio.Event()
        self.bus = InMemorySubscriptionBus()
        self.listen_handler = ListenHandler(self.bus)

    async def initialized(self, ctx: Context, params: types.NotificationParams) -> None:
        """``notifications/initialized``: remember the handshake-era connection it ends."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            self._track(ctx.session)

    def _track(self, session: ServerSession) -> None:
        connection = session_connection(session)
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

    async def resources_changed(self) -> None:
        """``notifications/resources/list_changed`` to every session (a photo arrived)."""
        for session in list(self._legacy.values()):
            with contextlib.suppress(Exception):
                await session.send_resource_list_changed()
        await self.bus.publish(ResourcesListChanged())


class McpFrontend:
    """The gateway's MCP face: builds the ``Server`` and answers its requests."""

    def __init__(
        self,
        config: Config,
        known: DeviceView,
        router: CallRouter,
        photos: PhotoStore | None = None,
        *,
        events: EventStore | None = None,
        notify_window: float = 0.2,
        audit: AuditLog | None = None,
        messenger: Messenger | None = None,
    ) -> None:
        self._config = config
        self._audit = audit  # calls to devices outside a caller's scope (the router audits calls)
        self.messenger = messenger or Messenger(config, AuditLog(None))
        self._notify_window = notify_window
        self._known = known
        self._router = router
        self.notifier = ChangeNotifier()
        self.lister = ToolLister(config, known)
        if events is None:  # in memory: the meta-tool and resources are there all the same
            events = EventStore(None, approved_in(known))
        self.events = events
        self.app = FleetApp(photos, events)
        self._photo_resources = PhotoResources(known, photos) if photos is not None else None
        if photos is not None:
            photos.subscribe_arrivals(lambda photo: self.notifier.resources_changed())
        self.event_resources = EventResources(known, events, self.notifier.bus,
                                              self.notifier.listen_handler)  # fmt: skip
        self.channels = Channels(config, known, events)
        self.server = GatewayServer(
            "esp-mcp-gateway",
            version=__version__,
            instructions=INSTRUCTIONS,
            # Without it, the SDK would page through the whole tools/list to find the schema of
            # each 2026-era call over HTTP (101 pages per call at 1,000 devices).
            get_tool_input_schema=self.input_schema,
            on_subscriptions_listen=self.event_resources.listen,
            on_subscribe_resource=self.event_resources.subscribe,
            on_unsubscribe_resource=self.event_resources.unsubscribe,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
        )
        # Registered by method rather than as on_list_tools: the handler answers in wire form
        # (a dict, which the SDK validates as it would a model), so that no SDK Tool model is
        # made per device tool per request (gateway/host_side/tool_listing.py).
        self.server.add_request_handler(
            "tools/list", types.PaginatedRequestParams, self._list_tools
        )
        # Likewise tools/call: a device's result is answered in wire form (call_results.py).
        self.server.add_request_handler("tools/call", types.CallToolRequestParams, self._call_tool)
        self.server.add_notification_handler(
            "notifications/initialized", types.NotificationParams, self._initialized
        )
        self.server.extensions.update(advertised())
        if not _tracing():
            # The SDK's span middleware wraps every message (each tool call) in a span that goes
            # nowhere until a tracer provider is installed: some 5 % of a call's CPU, for none.
            self.server.middleware.clear()

    async def _initialized(self, ctx: Context, params: types.NotificationParams) -> None:
        await self.notifier.initialized(ctx, params)
        self.channels.initialized(ctx)

    def stdio_options(self) -> InitializationOptions:
        """The init options of a stdio session: Claude Code's channel declared when a device
        opts in (gateway/host_side/channels.py)."""
        return self.server.create_initialization_options(
            experimental_capabilities=self.channels.capabilities()
        )

    async def forward_events(self) -> None:
        """Tell hosts of device events: subscribers and channels (runs for the gateway's life)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.event_resources.forward(), name="gateway.mcp.event_updates")
            tasks.create_task(self.channels.forward(), name="gateway.mcp.channels")

    async def forward_changes(self) -> None:
        """Push the known devices' changes to every MCP session (runs for the gateway's life).

        Changes that come within ``notify_window`` of each other go out as one notification, so
        a storm of joins costs hosts a bounded number of refetches.
        """
        async with self._known.changes() as changes:
            async for _ in changes:
                await asyncio.sleep(self._notify_window)  # let the rest of a storm fold in
                await self.notifier.tools_changed()

    def tools(
        self, cursor: str | None = None, scope: DeviceScope | None = None
    ) -> tuple[list[JsonObject], str | None]:
        """One page of the tool list hosts see (wire form), and the cursor of the next; of the
        devices ``scope`` sees, for a caller limited to some.

        The first page starts with the meta-tools, always there whatever the mode.
        """
        device_tools, first, following = self.lister.page(cursor, scope)
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
        scope = caller_of(ctx).scope
        tools, following = self.tools(params.cursor if params is not None else None, scope)
        if tools and tools[0] is _META_TOOLS[0] and self.app.negotiated(ctx):
            tools = [_wire(self.app.with_panel(LIST_DEVICES)), *asks.with_panel_tool(tools[1:])]
        # What a ListToolsResult dumps to: 2026-era sessions require resultType (the SDK's
        # check of the result drops it for older ones), and the cache hint (tool_listing.py).
        result: JsonObject = {"tools": tools, "resultType": "complete", **self.lister.cache_hint()}
        if following is not None:
            result["nextCursor"] = following
        return result

    async def _call_tool(self, ctx: Context, params: types.CallToolRequestParams) -> CallAnswer:
        arguments = params.arguments or {}
        caller = caller_of(ctx)
        if params.name == LIST_DEVICES.name:
            try:
                answer = list_devices(self._known, DeviceQuery(arguments, caller.scope))
            except ValueError as exc:
                return _error(f"list_devices: {exc}")
            text: list[types.ContentBlock] = [text_content(json.dumps(answer))]
            if self.app.negotiated(ctx):  # the panel's copy; other hosts get just the text
                return types.CallToolResult(
                    content=text, structured_content=self.app.structured(answer)
                )
            return types.CallToolResult(content=text)
        if params.name == asks.PANEL_TOOL and self.app.negotiated(ctx):  # the panel's only
            return asks.panel_decision(self._router.confirmations, caller, arguments)
        if params.name == CALL_DEVICE_TOOL.name:
            return await self._call_by_reference(ctx, caller, arguments)
        if params.name == WAIT_FOR_EVENT.name:
            return await self.event_resources.wait_for_event(ctx, arguments)
        if params.name == NOTIFY_DEVICE.name:
            find = functools.partial(self._device_for, caller, tool=NOTIFY_DEVICE.name)
            return await notify_device(self.messenger, find, caller, arguments)
        group = self.lister.group(params.name, caller.scope)
        if group is not None:
            return await self._call_grouped(ctx, caller, group, arguments)
        exposed = self._known.lookup(params.name)  # per-device names work in every mode
        if exposed is not None and not caller.sees(exposed.device):
            caller.unseen(self._audit, exposed.device, exposed.spec.name, arguments)
            exposed = None  # answered as a tool that does not exist
        elif exposed is None and caller.scope is not None and self.lister.group(params.name):
            caller.unseen(self._audit, None, params.name, arguments)  # a group of others' devices
        if exposed is None:  # the spec's answer to an unknown tool: a protocol error
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        return await self._invoke(ctx, caller, exposed, arguments)

    async def _call_grouped(
        self, ctx: Context, caller: Caller, group: ToolGroup, arguments: JsonObject
    ) -> CallAnswer:
        arguments = dict(arguments)
        ref = arguments.pop(group.argument, None)
        if not isinstance(ref, str):
            return _error(f"{group.name} needs `{group.argument}`: which device to use")
        tool = group.member(ref)
        if tool is None:
            device = self._known.find(ref)
            if device is not None and not caller.sees(device):
                caller.unseen(self._audit, device, group.spec.name, arguments)
            known = ", ".join(group.aliases(20)) + (", ..." if len(group.members) > 20 else "")
            return _error(f"no device {ref!r} offers {group.name} (devices that do: {known})")
        return await self._invoke(ctx, caller, tool, arguments)

    def _device_for(
        self, caller: Caller, ref: str, *, tool: str, arguments: JsonObject
    ) -> Device | str:
        """The device ``ref`` names for ``caller``, or why there is none: one outside its scope
        is answered as a device that does not exist (and audited)."""
        device = self._known.find(ref)
        if device is not None and not caller.sees(device):
            caller.unseen(self._audit, device, tool, arguments)
            device = None
        if device is None:
            seen = (d.alias for d in self._known.devices() if caller.sees(d))
            known = ", ".join(seen) or "none"
            return f"unknown device {ref!r} (known devices: {known})"
        return device

    async def _call_by_reference(
        self, ctx: Context, caller: Caller, arguments: JsonObject
    ) -> CallAnswer:
        device_ref, tool_ref = arguments.get("device"), arguments.get("tool")
        tool_arguments = arguments.get("arguments") or {}
        if not isinstance(device_ref, str) or not isinstance(tool_ref, str):
            return _error("call_device_tool needs string `device` and `tool` arguments")
        if not isinstance(tool_arguments, dict):
            return _error("call_device_tool: `arguments` must be an object")
        device = self._device_for(caller, device_ref, tool=tool_ref, arguments=tool_arguments)
        if isinstance(device, str):
            return _error(device)
        tool = resolve_tool(self._known, device, tool_ref)
        if isinstance(tool, str):
            return _error(tool)
        return await self._invoke(ctx, caller, tool, tool_arguments)

    async def _invoke(
        self, ctx: Context, caller: Caller, tool: DeviceTool, arguments: JsonObject
    ) -> CallAnswer:
        if caller.refusal is not None:
            return _error(caller.refusal)
        try:
            result = await self._router.call(
                tool, arguments, caller=caller.name, origin=caller.origin,
                asking=lambda: (asks.host_ask(ctx), asks.progress_of(ctx)),
            )  # fmt: skip
        except (CallRejected, DeviceError) as exc:
            return _error(str(exc))
        except asks.AskedInHost as asked:  # 2026 era: the question is the result; the host answers
            return asks.input_required(asked.pending)
        return call_result(result)

    async def _list_resources(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        cursor = params.cursor if params is not None else None
        panel = [PANEL] if cursor is None and self.app.negotiated(ctx) else []
        if cursor is None:  # the devices' events, on the first page
            panel += self.event_resources.resources(caller_of(ctx))
        if self._photo_resources is None:
            return types.ListResourcesResult(resources=panel)
        page = self._photo_resources.list(cursor, caller_of(ctx).scope)
        return page.model_copy(update={"resources": [*panel, *page.resources]})

    async def _list_templates(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        events = list(EVENT_TEMPLATES)
        if self._photo_resources is None:
            return types.ListResourceTemplatesResult(resource_templates=events)
        photos = self._photo_resources.templates()
        templates = [*photos.resource_templates, *events]
        return photos.model_copy(update={"resource_templates": templates})

    async def _read_resource(
        self, ctx: Context, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        panel = self.app.read(uri) or self.event_resources.read(uri, caller_of(ctx))
        if panel is not None:
            return panel
        if self._photo_resources is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri}")
        return await self._photo_resources.read(uri, caller_of(ctx).scope)


def resolve_tool(registry: DeviceView, device: Device, ref: str) -> DeviceTool | str:
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
