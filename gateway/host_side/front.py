"""The host listener's front: MCP requests straight to their guards, the rest to Starlette.

A host's every MCP request (each tool call) would otherwise pass Starlette's app, its error and
exception middleware, its router and the route before its own guards: seven coroutine frames
that each resumption of the request's task goes through again, and a route match, for nothing
the MCP path uses (the SDK's app answers its own errors, and uvicorn answers 500 for an app that
fails before it responded). The direct path keeps every check the whole app makes: the same
middleware (Host/Origin, authentication), in the same order, built from the same list, around
the same guarded endpoint. Anything else, ``/mcp/`` and a non-HTTP scope included, takes the
whole app as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["HostFront", "wrapped"]


def wrapped(app: ASGIApp, middleware: Sequence[Middleware]) -> ASGIApp:
    """``app`` inside ``middleware``, the first outermost, as Starlette stacks a list."""
    for cls, args, kwargs in reversed(middleware):
        app = cls(app, *args, **kwargs)
    return app


class HostFront:
    """ASGI front: an HTTP request for one of ``direct``'s paths to its app, the rest to ``app``.

    Each app of ``direct`` must carry the whole app's middleware itself (``wrapped``).
    """

    def __init__(self, app: ASGIApp, direct: Mapping[str, ASGIApp]) -> None:
        self.app = app
        self._direct = dict(direct)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request to its app."""
        if scope["type"] == "http" and not scope.get("root_path"):
            app = self._direct.get(scope["path"])
            if app is not None:
                await app(scope, receive, send)
                return
        await self.app(scope, receive, send)
