"""Who may use the MCP routes: the host token, an app's OAuth token, or (tokenless) anyone local.

``BearerTokens`` is the auth backend of the whole host listener: the static host token counts
everywhere (as before), an app's access token only on the MCP paths, and only when it was issued
for this very resource (RFC 8707). ``RequireToken`` answers everyone else on the MCP paths with
401 and the ``resource_metadata`` pointer (RFC 9728 §5.1), so a client knows where to sign in
(with no error code for a request that sent no credentials, RFC 6750 §3.1). On
a tokenless loopback listener a request without ``Authorization`` still passes, as it always did;
one with a bad token is refused, so an app learns that its token ended.

``AppStreams`` holds the requests (and their streams) of each app, so that revoking an app ends
them at once; a JSON-RPC request so cut (a tool call waiting on its device) is answered with an
error saying the app was revoked.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthCredentials, AuthenticationBackend, BaseUser
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.config import HostTokenOptions
from gateway.host_side.callers import app_of
from gateway.host_side.oauth.origin import OriginRules

__all__ = ["AppStreams", "BearerTokens", "RequireToken", "token_check"]

Verify = Callable[[str, HTTPConnection], Awaitable[AccessToken | None]]


def _on_mcp_path(path: str) -> bool:
    return path in ("/mcp", "/sse") or path.startswith("/messages/")


class BearerTokens(AuthenticationBackend):
    """The host token anywhere; a named host token (``[[host.tokens]]``) and an app's token
    (``verify``) on the MCP paths only: the dashboard and ``/api`` see every device."""

    def __init__(
        self,
        host_token: str | None,
        verify: Verify | None,
        named: Sequence[HostTokenOptions] = (),
    ) -> None:
        self._host = host_token.encode() if host_token else None
        self._verify = verify
        self._named = [(entry.token.encode(), entry) for entry in named]

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        """The credentials of ``conn``'s bearer token, or None."""
        header = conn.headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            return None
        token = header[7:].strip()
        if self._host is not None and hmac.compare_digest(token.encode(), self._host):
            return AuthCredentials([]), AuthenticatedUser(
                AccessToken(token=token, client_id="host", scopes=[])
            )
        if not _on_mcp_path(conn.url.path):
            return None
        for secret, entry in self._named:  # every one compared: the time says nothing of which
            if hmac.compare_digest(token.encode(), secret):
                claims = {"host_token": entry.name, "devices": list(entry.devices)}
                return AuthCredentials([]), AuthenticatedUser(
                    AccessToken(token=token, client_id="host", scopes=[], claims=claims)
                )
        if self._verify is None:
            return None
        access = await self._verify(token, conn)
        if access is None:
            return None
        return AuthCredentials(access.scopes), AuthenticatedUser(access)


def token_check(
    named: Sequence[HostTokenOptions], live: Callable[[bytes], bool] | None
) -> Callable[[bytes], bool] | None:
    """What authenticates a host connection beyond the host token (``gateway.net.limits``): a
    named host token, or a live app token (``live``); None when neither can."""
    secrets = [entry.token.encode() for entry in named]
    if not secrets:
        return live

    def check(token: bytes) -> bool:
        found = False
        for secret in secrets:  # every one compared: the time says nothing of which
            found |= hmac.compare_digest(token, secret)
        return found or (live is not None and live(token))

    return check


class AppStreams:
    """The open requests of each app, ended together when the app is revoked."""

    def __init__(self) -> None:
        self._live: dict[str, set[anyio.CancelScope]] = {}

    @contextmanager
    def hold(self, client_id: str) -> Iterator[anyio.CancelScope]:
        """Run a request of ``client_id`` so that ``end`` can stop it (``cancelled_caught``
        of the scope yielded says it did)."""
        with anyio.CancelScope() as scope:
            self._live.setdefault(client_id, set()).add(scope)
            try:
                yield scope
            finally:
                live = self._live.get(client_id)
                if live is not None:
                    live.discard(scope)
                    if not live:
                        del self._live[client_id]

    def count(self, client_id: str) -> int:
        """How many requests of ``client_id`` are open."""
        return len(self._live.get(client_id, ()))

    def end(self, client_id: str) -> None:
        """Stop every open request of ``client_id`` now."""
        for scope in self._live.pop(client_id, set()):
            scope.cancel()


class RequireToken:
    """ASGI guard of an MCP route: 401 with ``resource_metadata`` without valid credentials."""

    def __init__(
        self, app: ASGIApp, rules: OriginRules, streams: AppStreams, tokenless: bool
    ) -> None:
        self.app, self.rules, self.streams, self.tokenless = app, rules, streams, tokenless

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass a signed-in request on (an app's within its streams), else refuse it."""
        app = app_of(scope.get("user"))
        if app is not None:
            if "devices.list" not in app.scopes:
                await self._refuse(
                    scope, send, 403, "insufficient_scope", "Required scope: devices.list"
                )
                return
            response = _Response(send, receive)
            with self.streams.hold(app.client_id) as held:
                await self.app(scope, response.receive, response.send)
            if held.cancelled_caught:  # revoked mid-request: end its response properly
                await self._revoked(scope, send, response)
            return
        if isinstance(scope.get("user"), AuthenticatedUser):
            await self.app(scope, receive, send)
            return
        sent_token = False
        for name, _ in scope["headers"]:  # a loop, not any(): every tokenless call passes here
            if name == b"authorization":
                sent_token = True
                break
        if self.tokenless and not sent_token:
            await self.app(scope, receive, send)
            return
        if sent_token:
            why = "the access token is invalid, expired, revoked or for another resource"
            await self._refuse(scope, send, 401, "invalid_token", why)
        else:  # RFC 6750 §3.1: a request with no credentials gets no error code
            await self._refuse(scope, send, 401, None, "authentication required")

    async def _revoked(self, scope: Scope, send: Send, response: _Response) -> None:
        """End a request the app's revoke cut: its JSON-RPC requests (a tool call) get an error
        each, in the answer begun or as the answer; anything else, a 401 or the stream's end."""
        errors = response.errors()
        if not response.started:
            if not errors:
                await self._refuse(scope, send, 401, "invalid_token", "the app was revoked")
                return
            body = json.dumps(errors if response.batch else errors[0]).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
        elif not response.ended:
            events = b"".join(
                b"event: message\ndata: " + json.dumps(error).encode() + b"\n\n"
                for error in (errors if response.streaming else ())
            )
            await send({"type": "http.response.body", "body": events, "more_body": False})

    async def _refuse(
        self, scope: Scope, send: Send, status: int, error: str | None, why: str
    ) -> None:
        origin = self.rules.of(HTTPConnection(scope))
        error_part = f'error="{error}", error_description="{why}", ' if error else ""
        challenge = f'Bearer {error_part}resource_metadata="{origin.resource_metadata}"'
        answer = {"error": error, "error_description": why} if error else {"error_description": why}
        body = json.dumps(answer).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", challenge.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _Response:
    """What an app's request has sent so far: revoking it cuts the app off mid-response, and
    the server must still end what was started (a stream ends cleanly, not as a protocol
    error; uvicorn logs a response left open as an error), answering the requests of the
    request's body (a tool call) with a JSON-RPC error rather than nothing."""

    def __init__(self, send: Send, receive: Receive) -> None:
        self._send, self._receive = send, receive
        self.started = self.ended = self.streaming = False
        self._body: list[bytes] = []
        self._size = 0

    async def receive(self) -> Message:
        """The request's next message, its body kept (to a bound) for ``errors``."""
        message = await self._receive()
        if message["type"] == "http.request" and self._size <= _BODY_KEPT:
            chunk = message.get("body", b"")
            self._body.append(chunk)
            self._size += len(chunk)
        return message

    async def send(self, message: Message) -> None:
        """Pass ``message`` on, noting where the response stands."""
        if message["type"] == "http.response.start":
            self.started = True
            headers = dict(message.get("headers", ()))
            self.streaming = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self._send(message)

    @property
    def batch(self) -> bool:
        """Whether the request's body was a JSON-RPC batch."""
        return b"".join(self._body).lstrip().startswith(b"[")

    def errors(self) -> list[dict[str, object]]:
        """A JSON-RPC error for each request in the request's body: the app was revoked."""
        if self._size > _BODY_KEPT:
            return []
        try:
            sent = json.loads(b"".join(self._body))
        except ValueError:
            return []
        return [
            {"jsonrpc": "2.0", "id": request["id"], "error": _REVOKED}
            for request in (sent if isinstance(sent, list) else [sent])
            if isinstance(request, dict) and "method" in request and "id" in request
        ]


_BODY_KEPT = 1 << 20  # bytes of a request's body kept to answer it when the app is revoked
_REVOKED = {"code": -32001, "message": "the owner revoked this app's access: sign in again"}
