"""The host listener's small JSON API under ``/api/``: what the CLI uses (``devices``, ``call``,
``enroll``, approve/reject/forget/pair) and ``/healthz``.

Routes and their guards (Host/Origin, bearer auth) are laid out in http.py; this module holds
only what each endpoint does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.devices.calls import CallRouter, format_time
from gateway.devices.device import PENDING
from gateway.devices.enrollment import Enrollment
from gateway.devices.photos import PhotoStore
from gateway.devices.registry import Device, DeviceAdmin, DeviceView
from gateway.errors import (
    CallRejected,
    DeviceBusy,
    DeviceError,
    DeviceTimeout,
    GatewayError,
    StorageUnavailable,
)
from gateway.host_side.dashboard.session import actor_of
from gateway.host_side.device_listing import DeviceQuery, list_devices
from gateway.host_side.mcp_server import McpFrontend, resolve_tool

__all__ = ["AddBoard", "Enroll", "HostApi"]

Enroll = Callable[[str], dict[str, Any]]
AddBoard = Callable[[str, str | None, str | None], dict[str, Any]]  # (url, name, token)


class HostApi:
    """The small JSON API the CLI uses (``devices``, ``call``, ``enroll``)."""

    def __init__(
        self,
        frontend: McpFrontend,
        known: DeviceView,
        admin: DeviceAdmin,
        router: CallRouter,
        enroll: Enroll | None,
        photos: PhotoStore | None,
        *,
        trouble: Callable[[], str | None] | None = None,
        add_board: AddBoard | None = None,
        forget_board: Callable[[str], None] | None = None,
        enrollment: Enrollment | None = None,
    ) -> None:
        self.frontend, self.known, self.admin, self.router = frontend, known, admin, router
        self._enroll = enroll
        self._photos = photos
        self.trouble = trouble
        self.add_board = add_board
        self.forget_board = forget_board
        self.enrollment = enrollment  # the issued device tokens, to list and revoke

    async def enroll(self, request: Request) -> Response:
        """Issue a token for a board about to be flashed (``esp-mcp-gateway flash``)."""
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, 400)
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name.strip() or len(name) > 64:
            return JSONResponse({"error": "name must be a string of 1 to 64 characters"}, 400)
        if self._enroll is None:
            return JSONResponse({"error": "this gateway does not issue device tokens"}, 404)
        try:
            issued = self._enroll(name.strip())
        except StorageUnavailable as exc:  # a full or read-only data dir: try again later
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        self.known.audit.event("admin", "enroll", actor_of(request), device_id=None,
                                  alias=name.strip(), message=f"token {issued['id']}")  # fmt: skip
        return JSONResponse(issued)

    async def enrollments(self, request: Request) -> Response:
        """The device tokens issued so far (``esp-mcp-gateway enrollments``), newest first."""
        if self.enrollment is None:
            return JSONResponse({"error": "this gateway does not issue device tokens"}, 404)
        issued = [
            {**entry, "issued": format_time(entry["issued"]),
             "device": self._alias(entry["device_id"])}
            for entry in self.enrollment.issued()
        ]  # fmt: skip
        return JSONResponse({"enrollments": issued}, headers={"Cache-Control": "no-store"})

    def _alias(self, device_id: str | None) -> str | None:
        device = self.known.get(device_id) if device_id else None
        return device.alias if device is not None else None

    async def revoke_enrollment(self, request: Request) -> Response:
        """Revoke an issued device token: it admits nobody, and its board is disconnected."""
        body = await _json_body(request)
        token_id = body.get("id") if isinstance(body, dict) else None
        if not isinstance(token_id, str):
            return JSONResponse({"error": "expected {id}: the enrollment's id"}, 400)
        if self.enrollment is None:
            return JSONResponse({"error": "this gateway does not issue device tokens"}, 404)
        try:
            revoked = self.enrollment.revoke(token_id)
        except StorageUnavailable as exc:
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        if revoked is None:
            return JSONResponse({"error": f"no enrollment {token_id!r}: `esp-mcp-gateway "
                                 "enrollments` lists them"}, 404)  # fmt: skip
        device = self.known.get(revoked.device_id) if revoked.device_id else None
        if device is not None and device.session is not None:
            await device.session.aclose()  # it logs in again with the token, and is refused
        self.known.audit.event("admin", "revoke enrollment", actor_of(request),
                                  device_id=revoked.device_id, alias=revoked.name,
                                  message=f"token {token_id}")  # fmt: skip
        return JSONResponse({"revoked": {"id": token_id, "name": revoked.name,
                                         "device_id": revoked.device_id}})  # fmt: skip

    async def devices(self, request: Request) -> Response:
        """One page of devices; query parameters name, state, board and cursor as list_devices."""
        try:
            query = DeviceQuery(dict(request.query_params))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        return JSONResponse(list_devices(self.known, query))

    async def call(self, request: Request) -> Response:
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, 400)
        if not isinstance(body, dict) or not isinstance(body.get("device"), str):
            return JSONResponse({"error": "expected {device, tool, arguments}"}, 400)
        device = self.known.find(body["device"])
        if device is None:
            return JSONResponse({"error": f"unknown device {body['device']!r}"}, 404)
        ref, arguments = body.get("tool"), body.get("arguments") or {}
        if not isinstance(ref, str) or not isinstance(arguments, dict):
            return JSONResponse({"error": "tool must be a string, arguments an object"}, 400)
        tool = resolve_tool(self.known, device, ref)
        if isinstance(tool, str):
            return JSONResponse({"error": tool}, 400)
        try:
            actor = actor_of(request)
            result = await self.router.call(
                tool, arguments, caller=actor.who, origin=actor.where, user=True
            )
        except CallRejected as exc:
            return JSONResponse({"error": str(exc)}, 400)
        except DeviceError as exc:
            if isinstance(exc, DeviceBusy):  # come back later, not a broken device
                return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "1"})
            return JSONResponse({"error": str(exc)}, 504 if isinstance(exc, DeviceTimeout) else 502)
        return JSONResponse({"result": result})

    async def forget(self, request: Request) -> Response:
        """Remove a device and its names for good (``esp-mcp-gateway devices forget``)."""
        return await self._device_action(request, "forget", self._forget, close=True)

    def _forget(self, device: Device) -> None:
        if self.forget_board is not None:  # a board the gateway connects to: not any more
            self.forget_board(device.device_id)
        self.admin.forget(device)
        if self._photos is not None:
            self._photos.forget(device.device_id)
        self.frontend.events.forget(device.device_id)

    async def approve(self, request: Request) -> Response:
        """Let a pending device serve its tools (``esp-mcp-gateway devices approve``)."""
        return await self._device_action(request, "approve", self.admin.approve)

    async def reject(self, request: Request) -> Response:
        """Refuse a device from now on (``esp-mcp-gateway devices reject``)."""
        return await self._device_action(request, "reject", self.admin.reject, close=True)

    async def pair(self, request: Request) -> Response:
        """Approve new devices as they arrive for a while (``esp-mcp-gateway devices pair``)."""
        body = await _json_body(request)
        seconds = body.get("seconds", 120) if isinstance(body, dict) else None
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 < seconds <= 3600
        ):
            return JSONResponse({"error": "seconds must be a number from 1 to 3600"}, 400)
        until = self.admin.pair(float(seconds))
        # Pairing itself is held in memory (a restart ends it); the approvals it makes are saved.
        await self.admin.settle("pair", None, actor_of(request), f"for {seconds:g} s")
        return JSONResponse({"pairing_for": seconds, "until": format_time(until)})

    async def add(self, request: Request) -> Response:
        """Add a board that serves MCP itself by URL, approved (``esp-mcp-gateway devices add``)."""
        body = await _json_body(request)
        fields = [body.get(k) for k in ("url", "name", "token")] if isinstance(body, dict) else []
        if (
            not fields
            or not isinstance(fields[0], str)
            or not all(f is None or isinstance(f, str) for f in fields)
        ):
            return JSONResponse({"error": "expected {url, name?, token?}"}, 400)
        if self.add_board is None:
            return JSONResponse({"error": "this gateway does not add boards"}, 404)
        url, name, token = fields
        try:
            added = self.add_board(str(url), name, token)
        except StorageUnavailable as exc:  # boards.json is unreadable: kept, not written over
            return JSONResponse({"error": str(exc)}, 503)
        except GatewayError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        except OSError as exc:  # boards.json: a full or read-only data dir
            return JSONResponse({"error": f"not saved: {exc}"}, 503, headers={"Retry-After": "60"})
        await self.admin.settle("add", self.known.get(added["id"]), actor_of(request),
                                         added["url"])  # fmt: skip
        return JSONResponse({"added": added})

    async def _device_action(
        self, request: Request, verb: str, action: Callable[[Device], None], close: bool = False
    ) -> Response:
        """Do ``action`` to the device the body names; answer once it is saved (and audited)."""
        body = await _json_body(request)
        ref = body.get("device") if isinstance(body, dict) else None
        if not isinstance(ref, str):
            return JSONResponse({"error": "expected {device}: its name or id"}, 400)
        device = self.known.find(ref)
        if device is None:
            return JSONResponse({"error": f"unknown device {ref!r}"}, 404)
        if verb == "approve" and device.record.state == PENDING and device.conflict:
            # Two clients checked in with this id: approving would bind the first, maybe not
            # the user's own board. Start over rather than guess.
            return JSONResponse(
                {
                    "error": f"two clients claim the id of {device.alias} "
                    f"({device.conflict}): forget it, restart your device so it "
                    "checks in again, then approve it"
                },
                409,
            )
        session = device.session
        action(device)
        if close and session is not None:
            await session.aclose()  # if it comes back, the registry decides anew
        try:
            await self.admin.settle(verb, device, actor_of(request))
        except StorageUnavailable as exc:  # done in memory, not on disk: the user must know
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        done = {"approve": "approved", "reject": "rejected", "forget": "forgotten"}[verb]
        return JSONResponse({done: {"device": device.alias, "id": device.device_id}})

    async def health(self, request: Request) -> Response:
        """Alive; the device count only for a request that carries the host token."""
        body: dict[str, object] = {"status": "ok"}
        trouble = self.trouble() if self.trouble is not None else None
        if trouble is not None:  # cluster: cut from the broker (gateway/cluster)
            return JSONResponse({"status": "unavailable", "reason": trouble}, 503)
        user = request.scope.get("user")  # set by the bearer auth when a host token is configured
        if user is not None and user.is_authenticated:
            body["devices_online"] = self.known.online_count
        return JSONResponse(body)


async def _json_body(request: Request) -> Any:
    """The request's JSON body, or None when it is not JSON."""
    try:
        return json.loads(await request.body())
    except ValueError:
        return None
