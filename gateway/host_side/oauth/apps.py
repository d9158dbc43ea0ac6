"""Connected apps on the dashboard: who the owner let in, since when, last use; and Revoke.

``GET /api/oauth/apps`` lists every app with a live grant it redeemed; ``POST /api/oauth/revoke``
(``{client_id}``) ends all of an app's grants, and its open MCP requests and streams with them.
Both sit behind the dashboard's guard: an app's own token is never accepted here.
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
from gateway.host_side.oauth.consent import in_words
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
        try:
            body: Any = json.loads(await request.body())
        except ValueError:
            body = None
        client_id = body.get("client_id") if isinstance(body, dict) else None
        if not isinstance(client_id, str):
            return JSONResponse({"error": "expected {client_id}"}, 400)
        try:
            ended = self.site.provider.revoke_app(client_id, actor_of(request))
        except StorageUnavailable as exc:
            return JSONResponse({"error": str(exc)}, 503, headers={"Retry-After": "60"})
        if not ended:
            return JSONResponse({"error": f"no connected app {client_id!r}"}, 404)
        return JSONResponse({"revoked": {"client_id": client_id, "name": ended[0].client_name}})
