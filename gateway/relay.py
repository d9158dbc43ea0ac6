"""``stdio --connect``: relay MCP between stdin/stdout and a gateway's streamable-HTTP endpoint.

Claude Desktop only starts stdio servers; this lets its entry reach a gateway that runs in Docker
or on another machine. Messages pass through untouched, so every MCP feature (list_changed
notifications included) works as if the host were connected directly.
"""

from __future__ import annotations

import logging

import anyio
import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.server.stdio import stdio_server
from mcp.shared.message import ClientMessageMetadata, SessionMessage
from mcp.types import PROTOCOL_VERSION_META_KEY

__all__ = ["relay_stdio"]

logger = logging.getLogger(__name__)


def _with_version_header(message: SessionMessage) -> SessionMessage:
    """Stamp 2026-era requests with the header the HTTP transport picks the era from."""
    params = getattr(message.message, "params", None)
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
    if isinstance(version, str):
        return SessionMessage(
            message.message,
            metadata=ClientMessageMetadata(headers={"MCP-Protocol-Version": version}),
        )
    return message


async def relay_stdio(url: str, token: str | None) -> None:
    """Relay until the host closes stdin."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(30.0, read=None)  # tool calls and the push stream may idle long
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as (remote_read, remote_write),
        stdio_server() as (local_read, local_write),
        anyio.create_task_group() as tg,
    ):

        async def upstream() -> None:
            async for message in local_read:
                if isinstance(message, Exception):
                    logger.warning("dropped a malformed message from the host: %s", message)
                    continue
                await remote_write.send(_with_version_header(message))
            tg.cancel_scope.cancel()  # the host closed stdin: we are done

        async def downstream() -> None:
            async for message in remote_read:
                if isinstance(message, Exception):
                    logger.warning("gateway at %s: %s", url, message)
                    continue
                await local_write.send(message)

        tg.start_soon(upstream, name="gateway.relay.upstream")
        tg.start_soon(downstream, name="gateway.relay.downstream")
