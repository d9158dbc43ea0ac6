"""The JSON API of the calls waiting for the owner's yes: what ``esp-mcp-gateway calls`` and
the dashboard's Waiting for you list use.

``GET /api/calls`` lists them, ``POST /api/calls/allow`` and ``/api/calls/deny`` (``{id}``)
decide one, ``GET /api/calls/events`` is the list as a live SSE feed, and
``POST /api/dashboard/confirm`` (``{device, tool, confirm}``) sets whether a tool's calls wait
for a yes (kept in ``confirm.json`` in the data dir; ``GET ...?device=`` says it per tool).
The list itself lives in ``devices.confirmations``; every decision names who made it and by
which channel (``cli``, ``dashboard``, ``api``: the JSON API's callers, ``actor_of``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp

from gateway.devices.audit import Actor
from gateway.devices.confirmations import Confirmations, UnknownCall
from gateway.devices.registry import DeviceView
from gateway.errors import StorageUnavailable
from gateway.host_side.dashboard.session import Sessions, actor_of, cookie_value

__all__ = ["WaitingCalls"]

KEEPALIVE = 15.0  # seconds between SSE comments, so proxies keep an idle feed open
Guard = Callable[[ASGIApp], ASGIApp]
Handler = Callable[[Request], Awaitable[Response]]


class WaitingCalls:
    """The routes over the waiting calls of one gateway."""

    def __init__(
        self, confirmations: Confirmations, registry: DeviceView, sessions: Sessions | None
    ) -> None:
        self.confirmations = confirmations
        self.registry = registry
        self.sessions = sessions  # the dashboard's sign-ins: a feed ends with its session

    def routes(self, guard: Guard, endpoint: Callable[[Handler], ASGIApp]) -> list[BaseRoute]:
        """The routes, each behind ``guard`` (the host listener's auth)."""

        def api(path: str, handler: Handler, method: str = "GET") -> Route:
            return Route(path, endpoint=guard(endpoint(handler)), methods=[method])

        return [
            api("/api/calls", self.list),
            api("/api/calls/events", self.events),
            api("/api/calls/allow", self.allow, "POST"),
            api("/api/calls/deny", self.deny, "POST"),
            api("/api/dashboard/confirm", self.confirm_of),
            api("/api/dashboard/confirm", self.set_confirm, "POST"),
        ]

    def _listed(self) -> list[dict[str, Any]]:
        return [pending.as_json() for pending in self.confirmations.waiting()]

    async def list(self, request: Request) -> Response:
        """The calls waiting for a yes, oldest first."""
        return JSONResponse({"calls": self._listed()}, headers={"Cache-Control": "no-store"})

    async def allow(self, request: Request) -> Response:
        """Let the waiting call ``{id}`` reach its device."""
        return await self._decide(request, True)

    async def deny(self, request: Request) -> Response:
        """Refuse the waiting call ``{id}``: the device never sees it."""
        return await self._decide(request, False)

    async def _decide(self, request: Request, allow: bool) -> Response:
        body = await _json(request)
        call_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(call_id, str) or not call_id:
            return JSONResponse({"error": "expected {id}: the waiting call's id"}, 400)
        actor = actor_of(request)
        who = f"{actor.who} at {actor.where}" if actor.where else actor.who
        try:
            pending = self.confirmations.decide(call_id, allow, Actor(who, actor.who))
        except UnknownCall as exc:
            return JSONResponse({"error": str(exc)}, 404 if "no call" in str(exc) else 409)
        done = "allowed" if allow else "denied"
        return JSONResponse({done: pending.as_json()})

    async def events(self, request: Request) -> Response:
        """The waiting calls as server-sent events: now, then after every change."""
        session_id = cookie_value(request.headers.get("cookie", ""))
        signed_in = self.sessions is not None and session_id is not None
        sessions = self.sessions
        alive = (lambda: sessions.get(session_id) is not None) if sessions and signed_in else None
        if "authorization" in request.headers:
            alive = None  # a bearer token: no session to end
        return StreamingResponse(
            self._feed(alive),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def _feed(self, alive: Callable[[], bool] | None) -> AsyncIterator[str]:
        while alive is None or alive():
            changed = asyncio.ensure_future(self.confirmations.changed())
            yield f"event: calls\ndata: {json.dumps(self._listed())}\n\n"
            try:
                while True:
                    done, _ = await asyncio.wait({changed}, timeout=KEEPALIVE)
                    if done:
                        break
                    if alive is not None and not alive():
                        return  # signed out meanwhile
                    yield ": keepalive\n\n"
            finally:
                changed.cancel()

    async def confirm_of(self, request: Request) -> Response:
        """``?device=``: whether each of its tools waits for a yes."""
        device = self.registry.find(request.query_params.get("device", ""))
        if device is None:
            return JSONResponse({"error": "unknown device"}, 404)
        wanted = self.confirmations.wanted
        return JSONResponse({"tools": {name: wanted(tool) for name, tool in device.tools.items()}})

    async def set_confirm(self, request: Request) -> Response:
        """``{device, tool, confirm}``: whether that tool's calls wait for a yes, kept."""
        body = await _json(request)
        body = body if isinstance(body, dict) else {}
        fields = [body.get(k) for k in ("device", "tool", "confirm")]
        if (
            not isinstance(fields[0], str)
            or not isinstance(fields[1], str)
            or not (isinstance(fields[2], bool))
        ):
            return JSONResponse({"error": "expected {device, tool, confirm: true|false}"}, 400)
        device = self.registry.find(fields[0])
        if device is None:
            return JSONResponse({"error": f"unknown device {fields[0]!r}"}, 404)
        tool = device.tool(fields[1])
        if tool is None:
            return JSONResponse({"error": f"device {device.alias} has no tool {fields[1]!r}"}, 404)
        try:
            await self.confirmations.rules.choose(tool, fields[2])
        except (StorageUnavailable, OSError) as exc:
            return JSONResponse({"error": f"not saved: {exc}"}, 503, headers={"Retry-After": "60"})
        actor = actor_of(request)
        verb = "confirm" if fields[2] else "no confirm"
        self.registry.audit.event("admin", verb, actor, device_id=device.device_id,
                                  alias=device.alias, message=tool.spec.name)  # fmt: skip
        return JSONResponse({"device": device.alias, "tool": tool.spec.name,
                             "confirm": self.confirmations.wanted(tool)})  # fmt: skip


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        return None
