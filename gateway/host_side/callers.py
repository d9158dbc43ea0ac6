"""Who is calling through MCP, for the audit log, and what an app the owner let in may do.

An app signed in by OAuth (``gateway.host_side.oauth``) is named as the caller of its calls, and
calls tools only with the ``tools.call`` scope; a host with the host token, on stdio or tokenless
loopback is named by its transport, address and the client name it gave; one with a named host
token (``[[host.tokens]]``) by the token's name too. An app's grant and a named token carry the
devices they may use in the token's claims (``devices``: None for all), read anew at every
request, so an owner's edit counts from the app's next request (``device_scope.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from gateway.devices.audit import AuditLog
from gateway.host_side.device_scope import DeviceScope, Named, scope_of

__all__ = ["Caller", "app_of", "caller_of"]

Context = ServerRequestContext[Any, Any]


def app_of(user: object) -> AccessToken | None:
    """The app's token when ``user`` is an app signed in by OAuth (not the host token)."""
    if isinstance(user, AuthenticatedUser):
        claims = user.access_token.claims or {}
        if "grant" in claims:
            return user.access_token
    return None


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes an MCP call: as the audit log names it, its address, what it may not do."""

    name: str
    origin: str | None
    """The address the call came from; None on stdio."""
    refusal: str | None
    """Why this caller may not call tools, or None when it may."""
    scope: DeviceScope | None = None
    """The devices it may see and call; None for all."""

    def sees(self, device: Named) -> bool:
        """True when this caller may see and call ``device``."""
        return self.scope is None or self.scope.sees(device)

    def unseen(
        self, audit: AuditLog | None, device: Named | None, tool: str, arguments: dict[str, Any]
    ) -> None:
        """Audit this caller's call to a device outside its scope (answered as if unknown);
        ``device`` None: a grouped tool none of whose devices it sees."""
        if audit is None:
            return
        where = f"device {device.alias}" if device is not None else "every device of it"
        audit.record(
            caller=self.name,
            origin=self.origin,
            device_id=device.device_id if device is not None else None,
            alias=device.alias if device is not None else None,
            tool=tool,
            arguments=arguments,
            outcome="out_of_scope",
            message=f"refused: {where} is outside the devices this caller may use",
            started=time.monotonic(),
        )


def caller_of(ctx: Context) -> Caller:
    """The caller of the request ``ctx``, worked out in one pass (every call asks)."""
    request = ctx.request
    client = getattr(request, "client", None)  # Starlette makes it anew at every read
    origin = client.host if client is not None else None
    where = f"http:{origin}" if client is not None else "stdio"
    scope = getattr(request, "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    app = app_of(user)
    params = ctx.session.client_params
    if app is None and isinstance(user, AuthenticatedUser) and user.access_token.claims:
        claims = user.access_token.claims  # a named host token (oauth/guard.py)
        name = f"{where} token {claims['host_token']!r}"
        if params is not None:
            name += f" {params.client_info.name}"
        return Caller(name, origin, None, scope_of(claims["devices"]))
    if app is not None:
        refusal = None
        if "tools.call" not in app.scopes:
            refusal = "this app was allowed to list devices, not to call tools (scope tools.call)"
        claims = app.claims or {}
        return Caller(f"{where} app {claims.get('app')!r} ({app.client_id})",
                      origin, refusal, scope_of(claims.get("devices")))  # fmt: skip
    name = f"{where} {params.client_info.name}" if params is not None else where
    return Caller(name, origin, None)
