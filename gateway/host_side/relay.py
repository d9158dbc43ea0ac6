"""``stdio --connect``: relay MCP between stdin/stdout and a gateway's streamable-HTTP endpoint.

Claude Desktop only starts stdio servers; this lets its entry reach a gateway that runs in Docker
or on another machine. Messages pass through untouched, so every MCP feature (list_changed
notifications included) works as if the host were connected directly, in whichever protocol era
the host picks: a 2026-era request travels with the routing headers (``MCP-Protocol-Version``,
``Mcp-Method``, ``Mcp-Name``) the HTTP transport checks against its body.

What the relay cannot fix, a refused host token or a gateway it cannot reach, reaches the host as
the answer to its request (a JSON-RPC error saying what to do) and stderr as one line, and the
relay goes on until the host closes stdin: a gateway that comes back is used again.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import anyio
import httpx2
from mcp.client.streamable_http import streamable_http_client
from mcp.server.stdio import stdio_server
from mcp.shared.inbound import (
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PROTOCOL_VERSION_HEADER,
    NAME_BEARING_METHODS,
    encode_header_value,
)
from mcp.shared.message import ClientMessageMetadata, SessionMessage
from mcp.types import PROTOCOL_VERSION_META_KEY

__all__ = ["RELAY_ERROR", "relay_stdio"]

logger = logging.getLogger(__name__)

RELAY_ERROR = -32000  # JSON-RPC's implementation-defined server error: the gateway, not the host


def routing_headers(message: SessionMessage) -> dict[str, str]:
    """The HTTP headers a 2026-era request needs beside its body (none for older eras)."""
    method = getattr(message.message, "method", None)
    params = getattr(message.message, "params", None)
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None
    if not isinstance(version, str) or not isinstance(method, str):
        return {}
    headers = {MCP_PROTOCOL_VERSION_HEADER: version, MCP_METHOD_HEADER: method}
    name_key = NAME_BEARING_METHODS.get(method)
    name = params.get(name_key) if name_key and isinstance(params, dict) else None
    if isinstance(name, str):
        headers[MCP_NAME_HEADER] = encode_header_value(name)
    return headers


def _with_routing_headers(message: SessionMessage) -> SessionMessage:
    headers = routing_headers(message)
    if not headers:
        return message
    return SessionMessage(message.message, metadata=ClientMessageMetadata(headers=headers))


class _Explained(httpx2.AsyncBaseTransport):
    """HTTP to the gateway, with a refused token and an unreachable gateway made into errors.

    Both come back as a JSON-RPC error body, which the SDK's transport hands to the host as the
    answer to the request that met them; without this the host got a bare "Server returned an
    error response" or the relay died with a traceback.
    """

    def __init__(self, url: str, inner: httpx2.AsyncBaseTransport) -> None:
        self._url = url
        self._inner = inner
        self._said: str | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.TransportError as exc:
            return self._error(request, f"cannot reach the gateway at {self._url}: {_why(exc)}")
        if response.status_code in (401, 403) and request.method != "DELETE":
            await response.aclose()
            what = (
                "refused the host token"
                if "authorization" in request.headers
                else ("wants a host token")
            )
            return self._error(
                request,
                f"the gateway at {self._url} {what} (HTTP {response.status_code}): give the "
                "right one with --token or GATEWAY_HOST_TOKEN",
            )
        self._said = None  # it works (again): a later failure is news
        return response

    def _error(self, request: httpx2.Request, message: str) -> httpx2.Response:
        if message != self._said:  # one line per problem, not one per request
            logger.error("%s", message)
            self._said = message
        body: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": RELAY_ERROR, "message": message},
        }
        return httpx2.Response(502, json=body, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _why(exc: httpx2.TransportError) -> str:
    """The innermost cause, as ``connection refused`` or ``name or service not known``."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno and cause.strerror:
            strerror = os.strerror(cause.errno) if cause.errno > 0 else cause.strerror
            return strerror.lower()
        cause = cause.__cause__ or cause.__context__
    return str(exc) or type(exc).__name__


async def relay_stdio(url: str, token: str | None) -> None:
    """Relay until the host closes stdin."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(30.0, read=None)  # tool calls and the push stream may idle long
    transport = _Explained(url, httpx2.AsyncHTTPTransport())
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout, transport=transport) as http,
        streamable_http_client(url, http_client=http) as (remote_read, remote_write),
        stdio_server() as (local_read, local_write),
        # Both transports finish only once their write streams close: stdin's end closes them.
        remote_write,
        local_write,
        anyio.create_task_group() as tg,
    ):

        async def upstream() -> None:
            async for message in local_read:
                if isinstance(message, Exception):
                    logger.warning("dropped a malformed message from the host: %s", message)
                    continue
                await remote_write.send(_with_routing_headers(message))
            tg.cancel_scope.cancel()  # the host closed stdin: we are done

        async def downstream() -> None:
            async for message in remote_read:
                if isinstance(message, Exception):
                    logger.warning("gateway at %s: %s", url, message)
                    continue
                await local_write.send(message)

        tg.start_soon(upstream, name="gateway.host_side.relay.upstream")
        tg.start_soon(downstream, name="gateway.host_side.relay.downstream")
