"""A reverse proxy that serves an app under a path prefix, as Home Assistant's ingress does.

It strips the prefix, passes the browser's headers on (Host and Origin included, as the
Supervisor's ingress does) with the ones HA's ingress adds (X-Ingress-Path, X-Forwarded-Host and
-Proto), and the answer back unchanged (a redirect's relative Location too),
streaming both ways, so an SSE feed flows through. A request outside the prefix is a 404: a page
that asks for an absolute path breaks here as it would behind ingress.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx2
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

from tests.conftest import asgi_server

_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer",
        "proxy-connection", "content-length"}  # fmt: skip


@asynccontextmanager
async def ingress(upstream: str, prefix: str, source: str | None = None) -> AsyncIterator[str]:
    """Serve ``upstream`` under ``prefix``; yields the proxy's base URL (without the prefix).

    ``source``: the address the proxy connects from (127.0.0.2 plays the Supervisor's).
    """
    transport = httpx2.AsyncHTTPTransport(local_address=source) if source else None
    async with httpx2.AsyncClient(base_url=upstream, timeout=None, transport=transport) as client:

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            path = scope["path"]
            if not path.startswith(prefix + "/"):
                await PlainTextResponse("outside the ingress path", 404)(scope, receive, send)
                return
            request = Request(scope, receive)
            query = scope["query_string"].decode()
            headers = [(k, v) for k, v in request.headers.items() if k not in _HOP]
            # What HA's ingress adds (homeassistant/components/hassio/ingress.py, _init_header)
            headers += [("x-ingress-path", prefix),
                        ("x-forwarded-host", request.headers.get("host", "")),
                        ("x-forwarded-proto", request.url.scheme)]  # fmt: skip
            forwarded = client.build_request(
                request.method,
                path[len(prefix) :] + (f"?{query}" if query else ""),
                headers=headers,
                content=await request.body(),
            )
            answer = await client.send(forwarded, stream=True)

            async def body() -> AsyncIterator[bytes]:
                try:
                    async for chunk in answer.aiter_raw():
                        yield chunk
                finally:
                    await answer.aclose()

            response = StreamingResponse(body(), status_code=answer.status_code)
            response.raw_headers = [
                (k.encode(), v.encode()) for k, v in answer.headers.multi_items() if k not in _HOP
            ]
            await response(scope, receive, send)

        async with asgi_server(app, "test.ingress") as url:
            yield url
