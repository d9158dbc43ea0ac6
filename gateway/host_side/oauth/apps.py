"""Connected apps on the dashboard: who the owner let in, since when, last use; and Revoke.

``GET /api/oauth/apps`` lists every app with a live grant it redeemed; ``POST /api/oauth/revoke``
(``{client_id}``) ends all of an app's grants, and its open MCP requests and streams with them;
``POST /api/oauth/devices`` (``{client_id, devices}``, devices a list of device ids and name globs
or null for all) changes which devices the app may use, from its next request on.
App credentials, for apps that cannot register themselves (``credentials.py``):
``GET /api/oauth/credentials`` lists them, ``POST /api/oauth/credentials`` (``{name,
redirect_uri, no_pkce}``) makes them and answers the secret (the only time it is shown),
``POST /api/oauth/credentials/delete`` (``{client_id}``) deletes them and revokes their grants.
All sit behind the dashboard's guard: an app's own token is never accepted here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway.devices.calls import format_time
from gateway.errors import StorageUnavailable
from gateway.host_side.dashboard.session import actor_of
from gateway.host_side.device_scope import scope_words
from gateway.host_side.oauth.consent import in_words
from gateway.host_side.oauth.credentials import CredentialError, describe
from gateway.host_side.oauth.device_choice import patterns
from gateway.host_side.oauth.site import OAuthSite

__all__ = ["ConnectedApps"]

Handler = Callable[[Request], Awaitable[Response]]


class ConnectedApps:
    """The dashboard's JSON for connected apps."""

    def __init__(self, site: OAuthSite) -> None:
        self.site = site

    def routes(
        self, guard: Callable[[ASGIApp], ASGIApp], endpoint: Callable[[Handler], ASGIApp]
    ) -> list[Route]:
        """The two routes, behind ``guard``."""
        return [
            Route("/api/oauth/apps", guard(endpoint(self.apps)), methods=["GET"]),
            Route("/api/oauth/revoke", guard(endpoint(self.revoke)), methods=["POST"]),
            Route("/api/oauth/devices", guard(endpoint(self.devices)), methods=["POST"]),
            Route(
                "/api/oauth/credentials",
                guard(endpoint(self.credentials)),
                methods=["GET", "POST"],
            ),
            Route(
                "/api/oauth/credentials/delete",
                guard(endpoint(self.delete_credentials)),
                methods=["POST"],
            ),
        ]

    async def apps(self, request: Request) -> Response:
        """Every app with a live grant it redeemed, newest grant first."""
        apps: dict[str, dict[str, Any]] = {}
        redeemed = self.site.store.redeemed()
        for grant in self.site.store.grants():
            if grant.revoked_at is not None or grant.id not in redeemed:
                continue
            app = apps.setdefault(
                grant.client_id,
                {
                    "client_id": grant.client_id,
                    "name": grant.client_name,
                    "allowed": format_time(grant.granted_at),
                    "last_used": None,
                    "_last": 0.0,
                    "scopes": list(grant.scopes),
                    "may": [in_words(scope) for scope in grant.scopes],
                    "redirect": grant.redirect,
                    "devices": list(grant.devices) if grant.devices is not None else None,
                    "sees": scope_words(grant.devices),
                    "open_requests": self.site.streams.count(grant.client_id),
                },
            )
            if grant.last_used and grant.last_used > app["_last"]:
                app["_last"], app["last_used"] = grant.last_used, format_time(grant.last_used)
        for app in apps.values():
            del app["_last"]
        return JSONResponse({"apps": list(apps.values())}, headers={"Cache-Control": "no-store"})

    async def revoke(self, request: Request) -> Response:
        """End every grant of the app ``client_id``."""
        client_id = (await _body(request)).get("client_id")
        if not isinstance(client_id, str):
            return JSONResponse({"error": "expected {client_id}"}, 400)
        try:
            ended = self.site.provider.revoke_app(client_id, actor_of(request))
        except StorageUnavailable as exc:
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        if not ended:
            return JSONResponse({"error": f"no connected app {client_id!r}"}, 404)
        return JSONResponse({"revoked": {"client_id": client_id, "name": ended[0].client_name}})

    async def devices(self, request: Request) -> Response:
        """Let the app ``client_id`` use ``devices`` (null: all) from its next request."""
        body = await _body(request)
        client_id, given = body.get("client_id"), body.get("devices")
        if not isinstance(client_id, str) or not (given is None or isinstance(given, list)):
            return JSONResponse({"error": "expected {client_id, devices: [...] or null}"}, 400)
        try:
            devices = patterns(given) if given is not None else None
            changed = self.site.provider.set_devices(client_id, devices, actor_of(request))
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        except StorageUnavailable as exc:
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        if changed is None:
            return JSONResponse({"error": f"no connected app {client_id!r}"}, 404)
        return JSONResponse({"client_id": client_id, "devices": given and list(devices or ()),
                             "sees": scope_words(devices)})  # fmt: skip

    async def credentials(self, request: Request) -> Response:
        """``GET``: every app credential; ``POST``: new ones, with their secret (shown once)."""
        no_store = {"Cache-Control": "no-store"}
        if request.method == "GET":
            listed = [describe(c) for c in self.site.store.credentials()]
            return JSONResponse({"credentials": listed}, headers=no_store)
        body = await _body(request)
        name, redirect, no_pkce = body.get("name"), body.get("redirect_uri"), body.get("no_pkce")
        if not isinstance(name, str) or not isinstance(redirect, str):
            return JSONResponse({"error": "expected {name, redirect_uri, no_pkce}"}, 400)
        try:
            made, secret = await self.site.credentials.create(
                name, redirect, no_pkce is True, actor_of(request)
            )
        except CredentialError as exc:
            return JSONResponse({"error": str(exc)}, 400)
        except StorageUnavailable as exc:
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        return JSONResponse({**describe(made), "client_secret": secret}, 201, headers=no_store)

    async def delete_credentials(self, request: Request) -> Response:
        """Delete the credentials ``client_id``; every grant they had ends now."""
        client_id = (await _body(request)).get("client_id")
        if not isinstance(client_id, str):
            return JSONResponse({"error": "expected {client_id}"}, 400)
        actor = actor_of(request)
        try:
            gone = self.site.credentials.delete(client_id, actor)
            if gone is not None:
                self.site.provider.revoke_app(client_id, actor)
        except StorageUnavailable as exc:
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        if gone is None:
            return JSONResponse({"error": f"no app credentials {client_id!r}"}, 404)
        return JSONResponse({"deleted": describe(gone)})


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object ({} for anything else)."""
    try:
        body: Any = json.loads(await request.body())
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
