"""Who is calling through MCP, for the audit log, and what an app the owner let in may do.

An app signed in by OAuth (``gateway.host_side.oauth``) is named as the caller of its calls, and
calls tools only with the ``tools.call`` scope; a host with the host token, on stdio or tokenless
loopback is named by its transport, address and the client name it gave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

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


def caller_of(ctx: Context) -> Caller:
    """The caller of the request ``ctx``, worked out in one pass (every call asks)."""
    request = ctx.request
    client = getattr(request, "client", None)  # Starlette makes it anew at every read
    origin = client.host if client is not None else None
    where = f"http:{origin}" if client is not None else "stdio"
    scope = getattr(request, "scope", None)
    app = app_of(scope.get("user")) if isinstance(scope, dict) else None
    if app is not None:
        refusal = None
        if "tools.call" not in app.scopes:
            refusal = "this app was allowed to list devices, not to call tools (scope tools.call)"
        return Caller(f"{where} app {(app.claims or {}).get('app')!r} ({app.client_id})",
                      origin, refusal)  # fmt: skip
    params = ctx.session.client_params
    name = f"{where} {params.client_info.name}" if params is not None else where
    return Caller(name, origin, None)
