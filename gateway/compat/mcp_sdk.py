"""The MCP SDK's private names: sessions of the streamable-HTTP manager, a session's connection.

Checked with mcp 2.3.0 (pyproject pins ``mcp==2.3.*``).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from mcp.server.session import ServerSession
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

__all__ = ["discard_session", "session_connection", "sessions_owned_by"]


def sessions_owned_by(
    manager: StreamableHTTPSessionManager, client_id: str
) -> list[tuple[str, StreamableHTTPServerTransport]]:
    """The sessions ``manager`` holds that the OAuth client ``client_id`` opened, with their
    transports.

    Revoking an app ends its sessions; the manager records who opened each
    (``_session_owners``, session id -> ``AuthorizationContext``) and their transports
    (``_server_instances``), and says so nowhere public (mcp 2.3.0).
    """
    owners = manager._session_owners
    transports = manager._server_instances
    return [
        (session_id, transport)
        for session_id, owner in list(owners.items())
        if owner["client_id"] == client_id and (transport := transports.get(session_id)) is not None
    ]


def discard_session(
    manager: StreamableHTTPSessionManager, session_id: str, transport: StreamableHTTPServerTransport
) -> Coroutine[Any, Any, None]:
    """End one session as the manager does itself: forgotten at once (404 from then on), its
    transport terminated, shielded from cancellation (``_discard_session``, mcp 2.3.0)."""
    return manager._discard_session(session_id, transport)


def session_connection(session: ServerSession) -> Any | None:
    """The connection a handshake-era ``ServerSession`` was made for (``_connection``, mcp 2.3.0),
    or None where a session has none.

    Its ``exit_stack`` and ``has_standalone_channel`` (public on the connection) tell the gateway
    when that client goes and whether it can be pushed to; the session exposes it nowhere else.
    """
    return getattr(session, "_connection", None)
