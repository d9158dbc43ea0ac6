"""Who is calling through MCP, for the audit log, and what an app the owner let in may do.

An app signed in by OAuth (``gateway.host_side.oauth``) is named as the caller of its calls, and
calls tools only with the ``tools.call`` scope; a host with the host token, on stdio or tokenless
loopback is named by its transport, address and the client name it gave.
"""

from __future__ import annotations

from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

__all__ = ["app_of", "call_refusal", "caller_of"]

Context = ServerRequestContext[Any, Any]


def app_of(user: object) -> AccessToken | None:
    """The app's token when ``user`` is an app signed in by OAuth (not the host token)."""
    if isinstance(user, AuthenticatedUser):
        claims = user.access_token.claims or {}
        if "grant" in claims:
            return user.access_token
    return None


def _app(ctx: Context) -> Any:
    scope = getattr(ctx.request, "scope", None)
    return app_of(scope.get("user")) if isinstance(scope, dict) else None


def caller_of(ctx: Context) -> str:
    """The caller as the audit log names it."""
    client = getattr(ctx.request, "client", None)
    where = f"http:{client.host}" if client is not None else "stdio"
    app = _app(ctx)
    if app is not None:
        return f"{where} app {(app.claims or {}).get('app')!r} ({app.client_id})"
    params = ctx.session.client_params
    return f"{where} {params.client_info.name}" if params is not None else where


def call_refusal(ctx: Context) -> str | None:
    """Why this caller may not call tools, or None when it may."""
    app = _app(ctx)
    if app is not None and "tools.call" not in app.scopes:
        return "this app was allowed to list devices, not to call tools (scope tools.call)"
    return None
