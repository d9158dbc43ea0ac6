"""Each device's events as hosts see them: resources, their subscriptions, ``wait_for_event``.

``device://<name>/events`` holds the device's recent events, newest first, and
``device://<name>/state`` its latest event per logger (JSON text, docs/events.md). Hosts hear
that one changed in either era: 2025-era sessions that sent ``resources/subscribe`` get
``notifications/resources/updated``; 2026-era clients name the URIs in ``subscriptions/listen``
(``resourceSubscriptions``) and get the same notification on that stream. A host that shows no
subscriptions to its model can wait instead: the meta-tool ``wait_for_event`` returns the next
matching event, or says none came within its timeout (at most ``MAX_WAIT`` seconds).

Only approved devices' events are kept at all (``EventStore``); which devices a caller may see is
decided by ``may_see``, the one place every surface here asks.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
import mcp.types as types
from mcp import MCPError
from mcp.server import ServerRequestContext
from mcp.server.session import ServerSession
from mcp.server.subscriptions import ListenHandler, ResourceUpdated, SubscriptionBus

from gateway.compat.mcp_sdk import session_connection
from gateway.devices.calls import format_time
from gateway.devices.events import DeviceEvent, EventStore, events_uri, state_uri
from gateway.devices.registry import Device, DeviceView
from gateway.host_side.call_results import text_content
from gateway.host_side.callers import Caller, caller_of
from gateway.host_side.photo_resources import RESOURCE_NOT_FOUND

__all__ = ["MAX_WAIT", "WAIT_FOR_EVENT", "EventResources", "may_see"]

Context = ServerRequestContext[Any, Any]

MAX_WAIT = 60.0  # seconds wait_for_event may wait: a tool call must not outlive hosts' timeouts
DEFAULT_WAIT = 30.0
LISTED = 250  # devices whose event resources resources/list names (on its first page)
_KINDS = ("events", "state")

WAIT_FOR_EVENT = types.Tool(
    name="wait_for_event",
    title="Wait for a device event",
    description="Wait for the next event a device reports on its own (a button pressed, a door "
    "opened, a reading), optionally from one device and one logger, for at most `timeout` "
    f"seconds (default {DEFAULT_WAIT:g}, at most {MAX_WAIT:g}). Returns the event, or says "
    "none came. Recent events are also the resource device://<device>/events.",
    input_schema={
        "type": "object",
        "properties": {
            "device": {"type": "string", "description": "device name or id; any device if absent"},
            "logger": {"type": "string", "description": "only events of this logger, e.g. button"},
            "timeout": {
                "type": "number",
                "minimum": 0,
                "maximum": MAX_WAIT,
                "description": "seconds to wait",
            },
        },
        "additionalProperties": False,
    },
    annotations=types.ToolAnnotations(read_only_hint=True, destructive_hint=False),
)

TEMPLATES = [
    types.ResourceTemplate(
        name="device-events",
        title="A device's recent events",
        uri_template=events_uri("{device}"),
        description="What a device reported on its own, newest first (JSON), by device name.",
        mime_type="application/json",
    ),
    types.ResourceTemplate(
        name="device-state",
        title="A device's latest event per logger",
        uri_template=state_uri("{device}"),
        description="The latest event of each of a device's loggers (JSON), by device name.",
        mime_type="application/json",
    ),
]


def may_see(caller: Caller | None, device: Device) -> bool:
    """May ``caller`` see ``device``'s events? Every decision of this module comes here.

    Only approved devices' events reach anyone; a caller's own device set (its scope) narrows
    that further (a named token, an app limited to some devices).
    """
    return device.approved and (caller is None or caller.sees(device))


def event_ref(uri: str) -> tuple[str, str] | None:
    """The device name and ``events`` or ``state`` an event URI names, else None."""
    if not uri.startswith("device://"):
        return None
    alias, _, kind = uri[len("device://") :].rpartition("/")
    return (alias, kind) if alias and "/" not in alias and kind in _KINDS else None


def _event_json(event: DeviceEvent, alias: str) -> dict[str, Any]:
    return {**event.shown(alias), "time": format_time(event.at)}


class EventResources:
    """The event resources, their subscriptions in both eras, and ``wait_for_event``."""

    def __init__(
        self,
        registry: DeviceView,
        events: EventStore,
        bus: SubscriptionBus,
        listen: ListenHandler,
    ) -> None:
        """Publish 2026-era updates on ``bus``, which ``listen`` serves."""
        self._registry = registry
        self._events = events
        self._bus = bus
        self._listen = listen
        # 2025-era sessions' subscriptions, by connection (a new ServerSession proxy comes with
        # each message: reference/mcp-sdk-2x.md §2.4)
        self._subscribed: dict[int, tuple[ServerSession, set[str]]] = {}

    # --- resources ---------------------------------------------------------------------------

    def resources(self, caller: Caller | None) -> list[types.Resource]:
        """Both resources of the first ``LISTED`` devices by name with events that ``caller`` may
        see (the templates name the others')."""
        listed: list[types.Resource] = []
        found = sorted(self._devices_with_events(caller), key=lambda d: d.alias)
        for device in found[:LISTED]:
            count = len(self._events.recent(device.device_id))
            listed += [
                types.Resource(
                    uri=events_uri(device.alias),
                    name=f"{device.alias}-events",
                    title=f"{device.alias}: recent events",
                    description=f"{count} recent events of {device.alias}, newest first",
                    mime_type="application/json",
                ),
                types.Resource(
                    uri=state_uri(device.alias),
                    name=f"{device.alias}-state",
                    title=f"{device.alias}: latest per logger",
                    description=f"The latest event of each logger of {device.alias}",
                    mime_type="application/json",
                ),
            ]
        return listed

    def _devices_with_events(self, caller: Caller | None) -> list[Device]:
        found = []
        for device in self._registry.devices():
            has = self._events.recent(device.device_id) or self._events.state(device.device_id)
            if has and may_see(caller, device):
                found.append(device)
        return found

    def read(self, uri: str, caller: Caller | None) -> types.ReadResourceResult | None:
        """The resource ``uri`` names; None when it is not an event URI.

        Raises:
            MCPError: no such device, or not one this caller may see.
        """
        ref = event_ref(uri)
        if ref is None:
            return None
        device = self._visible(ref[0], caller)
        if device is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri} (no device {ref[0]!r})")
        if ref[1] == "events":
            body: object = [
                _event_json(e, device.alias) for e in self._events.recent(device.device_id)
            ]
        else:
            state = self._events.state(device.device_id)
            body = {name: _event_json(e, device.alias) for name, e in state.items()}
        text = json.dumps(body, ensure_ascii=False)
        contents = types.TextResourceContents(uri=uri, mime_type="application/json", text=text)
        return types.ReadResourceResult(contents=[contents])

    def _visible(self, ref: str, caller: Caller | None) -> Device | None:
        device = self._registry.find(ref)
        return device if device is not None and may_see(caller, device) else None

    # --- subscriptions -----------------------------------------------------------------------

    async def subscribe(
        self, ctx: Context, params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        """``resources/subscribe`` (2025 era): this session hears when ``uri`` changes."""
        uri = str(params.uri)
        ref = event_ref(uri)
        if ref is None or self._visible(ref[0], caller_of(ctx)) is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Resource not found: {uri} (no device events)")
        connection = session_connection(ctx.session)
        if connection is not None:
            key = id(connection)
            if key not in self._subscribed:
                self._subscribed[key] = (ctx.session, set())
                connection.exit_stack.callback(self._subscribed.pop, key, None)
            self._subscribed[key][1].add(uri)
        return types.EmptyResult()

    async def unsubscribe(
        self, ctx: Context, params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        """``resources/unsubscribe`` (2025 era)."""
        connection = session_connection(ctx.session)
        entry = self._subscribed.get(id(connection)) if connection is not None else None
        if entry is not None:
            entry[1].discard(str(params.uri))
        return types.EmptyResult()

    async def listen(
        self, ctx: Context, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """``subscriptions/listen`` (2026 era): the SDK's stream, with the event URIs this
        caller may not see taken out of what it asked for."""
        wanted = params.notifications.resource_subscriptions
        if wanted:
            caller = caller_of(ctx)
            kept = [
                uri
                for uri in wanted
                if (ref := event_ref(uri)) is None or self._visible(ref[0], caller) is not None
            ]
            notifications = params.notifications.model_copy(update={"resource_subscriptions": kept})
            params = params.model_copy(update={"notifications": notifications})
        return await self._listen(ctx, params)

    async def forward(self) -> None:
        """Tell subscribers of each event kept (runs for the gateway's life)."""
        async with self._events.watch() as feed:
            async for event in feed:
                device = self._registry.get(event.device_id)
                if device is None:
                    continue
                for uri in (events_uri(device.alias), state_uri(device.alias)):
                    await self._updated(uri)

    async def _updated(self, uri: str) -> None:
        for session, uris in list(self._subscribed.values()):
            if uri in uris:
                with contextlib.suppress(Exception):  # a session gone is skipped, never fatal
                    await session.send_resource_updated(uri)
        await self._bus.publish(ResourceUpdated(uri=uri))

    # --- wait_for_event ----------------------------------------------------------------------

    async def wait_for_event(self, ctx: Context, arguments: dict[str, Any]) -> types.CallToolResult:
        """The meta-tool: the next event matching ``device`` and ``logger``, or why none."""
        device_ref, logger, timeout = (arguments.get(k) for k in ("device", "logger", "timeout"))
        if (
            device_ref is not None
            and not isinstance(device_ref, str)
            or (logger is not None and not isinstance(logger, str))
        ):
            return _error("wait_for_event: `device` and `logger` must be strings")
        if timeout is None:
            timeout = DEFAULT_WAIT
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            return _error("wait_for_event: `timeout` must be a number of seconds, 0 or more")
        clamped = timeout > MAX_WAIT
        timeout = min(float(timeout), MAX_WAIT)
        caller = caller_of(ctx)
        device = None
        if device_ref is not None:
            device = self._visible(device_ref, caller)
            if device is None:
                return _error(f"wait_for_event: unknown device {device_ref!r}")
        async with self._events.watch() as feed:
            with anyio.move_on_after(timeout):
                async for event in feed:
                    seen = self._registry.get(event.device_id)
                    if seen is None or not may_see(caller, seen):
                        continue
                    if device is not None and event.device_id != device.device_id:
                        continue
                    if logger is not None and event.logger != logger:
                        continue
                    body = json.dumps(_event_json(event, seen.alias), ensure_ascii=False)
                    return types.CallToolResult(content=[text_content(body)])
        where = f" from {device.alias}" if device is not None else ""
        where += f" with logger {logger!r}" if logger is not None else ""
        note = f" (the timeout asked for was {arguments['timeout']:g} s; at most {MAX_WAIT:g})"
        return types.CallToolResult(
            content=[
                text_content(f"no event{where} within {timeout:g} s" + (note if clamped else ""))
            ]
        )


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[text_content(text)], is_error=True)
