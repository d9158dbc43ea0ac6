"""Fleet tools (``[upstream] fleet_tools = true``): a device's voice server may use the fleet.

The upstream lists the device's tools (``tools/list``, one id for every page, ``cursor``) and
offers them to its model. With fleet tools on, and the device approved by the user, the page
that ends the listing (no ``nextCursor``) also carries the tools of the other devices, as MCP
hosts see them (their MCP names, the model's policy applied), so one can ask the kitchen speaker
to switch off the bedroom lamp. The upstream's ``tools/call`` of such a name never reaches the
device: the gateway calls the other device through ``CallRouter`` (policy, argument checks,
timeout, audit with the upstream named as the caller) and answers the upstream with its id.

``FleetTools`` is shared by both relays (WebSocket and MQTT): ``from_upstream`` before the tap,
``from_device`` on the tap's way back to the upstream, ``start`` for a fleet call (its task, its
bound, its failures are kept here, one home for both relays), ``stop`` when the relay ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.devices.calls import CallRouter
from gateway.devices.registry import DeviceRegistry
from gateway.errors import CallRejected, DeviceError
from gateway.protocol import make_error, make_result

__all__ = ["FleetTools"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]
Answer = Callable[[JsonObject], Awaitable[None]]

MAX_TOOLS = 64  # fleet tools offered at most: the upstream's model reads every one of them
MAX_CALLS = 4  # fleet calls one upstream may run at once; more are answered "busy"
_INVALID_PARAMS = -32602
_BUSY = -32000
_INTERNAL = -32603


class FleetTools:
    """The fleet offered to one device's upstream (see the module docstring)."""

    def __init__(
        self, registry: DeviceRegistry, router: CallRouter, device_id: str, caller: str
    ) -> None:
        """Offer the fleet to the upstream of ``device_id``.

        Args:
            registry: where the other devices' tools are.
            router: the gateway's call path.
            device_id: the proxied device (its own tools are not repeated).
            caller: who the audit log names for the upstream's calls, e.g. ``upstream
                api.tenclass.net``.
        """
        self._registry = registry
        self._router = router
        self._device_id = device_id
        self.caller = caller
        self._listing: set[object] = set()  # ids of the upstream's open tools/list requests
        self._calls: set[asyncio.Task[None]] = set()  # the fleet calls running (<= MAX_CALLS)

    def entries(self) -> list[JsonObject]:
        """The other devices' tools as the upstream's model sees them."""
        entries: list[JsonObject] = []
        if not self._trusted():
            return entries
        for tool in self._registry.exposed_tools():
            if tool.device.device_id == self._device_id or not tool.device.approved:
                continue  # its own tools it lists itself; a waiting device's would be refused
            if len(entries) == MAX_TOOLS:
                logger.info("device %s: its upstream is offered the first %d fleet tools only",
                            self._device_id, MAX_TOOLS)  # fmt: skip
                break
            spec = tool.spec
            entries.append({
                "name": tool.name,
                "description": f"On device {tool.device.alias}: {spec.description}",
                "inputSchema": spec.input_schema,
            })  # fmt: skip
        return entries

    def from_upstream(self, payload: object) -> bool:
        """Note an upstream request on its way to the device; True if it is a fleet call."""
        if not isinstance(payload, dict) or "id" not in payload:
            return False
        method = payload.get("method")
        if method == "tools/list":
            self._listing.add(_key(payload["id"]))
            return False
        if method != "tools/call":
            return False
        params = payload.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        tool = self._registry.lookup(name) if isinstance(name, str) else None
        return tool is not None and tool.device.device_id != self._device_id and self._trusted()

    def _trusted(self) -> bool:
        # A device the user has not approved (any stock device can check in) must not become a
        # voice remote for the whole fleet: its server gets its own tools only.
        device = self._registry.get(self._device_id)
        return device is not None and device.approved

    def from_device(self, payload: object) -> object:
        """The device's reply for the upstream, with the fleet added to its last listing page."""
        if not isinstance(payload, dict) or "method" in payload:
            return payload
        key = _key(payload.get("id"))
        if key not in self._listing:
            return payload
        result = payload.get("result")
        if isinstance(result, dict) and result.get("nextCursor"):
            return payload  # more pages follow, under the same id
        self._listing.discard(key)
        tools = result.get("tools") if isinstance(result, dict) else None
        if not isinstance(result, dict) or not isinstance(tools, list):
            return payload  # an error, or no listing: nothing to add to
        fleet = self.entries()
        if not fleet:
            return payload
        return {**payload, "result": {**result, "tools": [*tools, *fleet]}}

    async def call(self, request: JsonObject) -> JsonObject:
        """Run the upstream's fleet call ``request``; return the reply with its id."""
        request_id = request["id"]
        params = request.get("params")
        assert isinstance(params, dict)
        arguments = params.get("arguments", {})
        tool = self._registry.lookup(str(params.get("name")))
        if tool is None or not isinstance(arguments, dict):
            return make_error(
                request_id, _INVALID_PARAMS, "unknown tool or arguments not an object"
            )
        try:
            result = await self._router.call(tool, arguments, caller=self.caller)
        except (CallRejected, DeviceError) as exc:
            result = {"content": [{"type": "text", "text": str(exc)}], "isError": True}
        return make_result(request_id, result)

    def start(self, request: JsonObject, answer: Answer) -> JsonObject | None:
        """Run the upstream's fleet call ``request`` in its own task; ``answer`` gets its reply.

        Returns:
            None once started. The "busy" error reply when ``MAX_CALLS`` of this upstream's run
            already, for the relay to send at once: a flood of calls costs no task, and each
            call gets an answer.
        """
        if len(self._calls) >= MAX_CALLS:
            return make_error(request["id"], _BUSY, "too many fleet calls at once; try again later")
        name = f"gateway.upstream.fleet_call[{self._device_id}]"  # as the relays' tasks
        task = asyncio.create_task(self._answer(request, answer), name=name)
        self._calls.add(task)
        task.add_done_callback(self._ended)
        return None

    async def stop(self) -> None:
        """Cancel the fleet calls still running: the relay has ended, no one takes the reply."""
        for task in self._calls:
            task.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)

    async def _answer(self, request: JsonObject, answer: Answer) -> None:
        try:
            reply = await self.call(request)
        except Exception:  # a fault on the gateway's side: said, and the upstream still answered
            logger.exception("device %s: a fleet call of its upstream failed", self._device_id)
            reply = make_error(request["id"], _INTERNAL, "the gateway failed this fleet call")
        await answer(reply)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._calls.discard(task)
        failure = None if task.cancelled() else task.exception()
        if failure is not None:  # no one awaits the task: said here, or never
            logger.error("device %s: the reply to a fleet call of its upstream failed",
                         self._device_id, exc_info=failure)  # fmt: skip


def _key(request_id: object) -> object:
    # The upstream parses ids with int(): 2 and 2.0 are one request.
    if isinstance(request_id, float) and request_id.is_integer():
        return int(request_id)
    return request_id
