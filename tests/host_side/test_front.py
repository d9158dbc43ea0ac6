"""Tests for gateway.host_side.front: which requests skip Starlette's layers, what wraps them."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.host_side.front import HostFront, wrapped

pytestmark = pytest.mark.anyio


class Recorder:
    """An ASGI app (or middleware) that notes its name in the scope's ``seen`` and passes on."""

    def __init__(self, app: ASGIApp | None = None, name: str = "app") -> None:
        self.app, self.name = app, name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("seen", []).append(self.name)
        if self.app is not None:
            await self.app(scope, receive, send)


async def _nothing() -> Message:
    return {}


async def _drop(message: Message) -> None:
    pass


async def _served(front: HostFront, **scope: Any) -> list[str]:
    request: dict[str, Any] = {"type": "http", "path": "/mcp", "root_path": "", **scope}
    await front(request, _nothing, _drop)
    seen: list[str] = request["seen"]
    return seen


async def test_only_an_http_request_for_a_direct_path_skips_the_whole_app() -> None:
    """POST /mcp goes to its own chain; /mcp/, other paths, a WebSocket and a mounted app's
    requests take the whole app as before."""
    front = HostFront(Recorder(name="starlette"), {"/mcp": Recorder(name="mcp")})
    assert await _served(front) == ["mcp"]
    assert await _served(front, path="/mcp/") == ["starlette"]
    assert await _served(front, path="/api/devices") == ["starlette"]
    assert await _served(front, type="websocket") == ["starlette"]
    assert await _served(front, root_path="/prefix") == ["starlette"]


async def test_the_direct_chain_wraps_its_app_in_the_whole_apps_middleware_in_order() -> None:
    """``wrapped`` stacks a middleware list as Starlette does: the first one outermost."""
    middleware = [Middleware(Recorder, name="host-origin"), Middleware(Recorder, name="auth")]
    front = HostFront(Recorder(name="starlette"), {"/mcp": wrapped(Recorder(), middleware)})
    assert await _served(front) == ["host-origin", "auth", "app"]
