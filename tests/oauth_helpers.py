"""Helpers for OAuth end-to-end tests, for any client: a gateway with OAuth and a host token,
the owner played by headless Chromium on the real consent page, an app's redirect URI (a real
loopback server), an https server for client metadata documents (a self-signed certificate made
by openssl, trusted through ``SSL_CERT_FILE``), and the MCP Python SDK's ``OAuthClientProvider``
wired to all of them.

Other clients (the TypeScript SDK, mcp-remote) reuse ``oauth_gateway``, ``ConsentBrowser`` (give
``consent()`` the authorization URL the client wants opened) and ``Callback``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import socket
import subprocess
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import httpx2
import uvicorn
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from playwright.async_api import Browser, BrowserContext, Page, async_playwright
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.app import Running
from tests.conftest import asgi_server, bound, gateway, program

HOST_TOKEN = "host-secret-for-oauth-tests"
ADMIN = {"Authorization": f"Bearer {HOST_TOKEN}"}
STREAM = {"Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"},
    },
}


@asynccontextmanager
async def oauth_gateway(data_dir: Path, **overrides: Any) -> AsyncIterator[Running]:
    """A real gateway with a host token (so consent needs sign-in) and OAuth on."""
    async with gateway(data_dir, host_token=HOST_TOKEN, **overrides) as run:
        yield run


def base_url(run: Running) -> str:
    """The host listener's base URL (the OAuth issuer on loopback)."""
    return f"http://127.0.0.1:{run.host_port}"


@asynccontextmanager
async def http_to(run: Running, **headers: str) -> AsyncIterator[httpx2.AsyncClient]:
    """A plain HTTP client of the gateway's host listener (an app without an SDK)."""
    async with httpx2.AsyncClient(
        base_url=base_url(run), timeout=bound(10), headers=headers
    ) as http:
        yield http


async def mcp_with(
    http: httpx2.AsyncClient, token: str, message: Mapping[str, Any] = INITIALIZE
) -> httpx2.Response:
    """``message`` (an ``initialize``) posted to /mcp with ``token`` as the bearer."""
    return await http.post(
        "/mcp", json=message, headers={**STREAM, "Authorization": f"Bearer {token}"}
    )


def ms(seconds: float) -> float:
    """A Playwright timeout (milliseconds), scaled like every other bound."""
    return bound(seconds) * 1000


class Callback:
    """An app's redirect URI: a real loopback server that records what the browser brought."""

    def __init__(self) -> None:
        self.url = ""
        self.received: list[dict[str, str]] = []
        self._arrived = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if request.url.path != "/callback":  # the browser's /favicon.ico
            await PlainTextResponse("not found", 404)(scope, receive, send)
            return
        self.received.append(dict(request.query_params))
        self._arrived.set()
        await PlainTextResponse("Signed in: you can close this window.")(scope, receive, send)

    async def next(self) -> dict[str, str]:
        """The query parameters of the next redirect (one already arrived counts)."""
        with anyio.fail_after(bound(20)):
            await self._arrived.wait()
        self._arrived = anyio.Event()
        return self.received[-1]

    async def result(self) -> AuthorizationCodeResult:
        """The next redirect, as the SDK's ``callback_handler`` returns it."""
        query = await self.next()
        return AuthorizationCodeResult(
            code=query.get("code", ""), state=query.get("state"), iss=query.get("iss")
        )


@asynccontextmanager
async def callback_server() -> AsyncIterator[Callback]:
    """A ``Callback`` listening; its ``url`` is ``http://127.0.0.1:<port>/callback``."""
    callback = Callback()
    async with asgi_server(callback, "oauth-callback") as base:
        callback.url = f"{base}/callback"
        yield callback


@dataclass
class ConsentBrowser:
    """The owner in headless Chromium (Debian's): opens the consent page and answers it."""

    browser: Browser
    token: str | None = HOST_TOKEN  # typed into the page's host token field, when it shows one
    decision: str = "allow"  # or "deny"
    pages: list[Page] = field(default_factory=list)

    async def open(self, url: str, context: BrowserContext | None = None) -> Page:
        """``url`` in a new page, in ``context`` or a fresh browser profile."""
        context = context or await self.browser.new_context()
        page = await context.new_page()
        page.set_default_timeout(ms(10))
        self.pages.append(page)
        await page.goto(url)
        return page

    async def consent(self, url: str, context: BrowserContext | None = None) -> Page:
        """Open ``url``, sign in with the host token if asked, press Allow (or Deny), and wait
        until the browser has left the gateway for the app's redirect URI."""
        page = await self.open(url, context)
        await self.answer(page)
        if "/consent" in page.url:  # the gateway refused the answer: say why
            raise AssertionError(f"consent refused: {await page.inner_text('body')}")
        return page

    async def answer(self, page: Page) -> None:
        """On the consent page open in ``page``: sign in if asked, press Allow (or Deny), and
        wait for the navigation that follows."""
        await page.wait_for_selector("#allow")
        token_field = page.locator('input[name="token"]')
        if self.token is not None and await token_field.count():
            await token_field.fill(self.token)
        async with page.expect_navigation():
            await page.click(f"#{self.decision}")


@asynccontextmanager
async def consent_browser() -> AsyncIterator[ConsentBrowser]:
    """A ``ConsentBrowser`` on headless Chromium, closed on exit."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=program("chromium"))
        try:
            yield ConsentBrowser(browser)
        finally:
            await browser.close()


class MemoryStorage:
    """The SDK's ``TokenStorage`` in memory."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def sdk_auth(
    run: Running,
    owner: ConsentBrowser,
    callback: Callback,
    *,
    name: str = "SDK test app",
    metadata_url: str | None = None,
    storage: MemoryStorage | None = None,
) -> OAuthClientProvider:
    """The MCP SDK's ``OAuthClientProvider`` for ``run``'s /mcp, with Chromium as its browser."""

    async def redirect(url: str) -> None:
        await owner.consent(url)

    metadata = OAuthClientMetadata(
        client_name=name,
        redirect_uris=[callback.url],  # type: ignore[list-item]
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none" if metadata_url else "client_secret_post",
    )
    return OAuthClientProvider(
        run.mcp_url,
        metadata,
        storage or MemoryStorage(),
        redirect_handler=redirect,
        callback_handler=callback.result,
        client_metadata_url=metadata_url,
    )


@asynccontextmanager
async def sdk_client(run: Running, auth: httpx2.Auth, **options: Any) -> AsyncIterator[Client]:
    """An MCP SDK ``Client`` on ``run``'s /mcp that signs in with ``auth`` (``options``: the
    ``Client``'s, such as ``message_handler``)."""
    async with httpx2.AsyncClient(auth=auth, timeout=bound(30)) as http:
        transport = streamable_http_client(run.mcp_url, http_client=http)
        async with Client(transport, **options) as client:
            yield client


def self_signed(folder: Path, names: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and the DNS ``names`` (its own CA) and its key, made by
    openssl."""
    program("openssl")
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            ",".join(["subjectAltName=IP:127.0.0.1", *(f"DNS:{name}" for name in names)]),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@asynccontextmanager
async def https_server(app: ASGIApp, cert: Path, key: Path) -> AsyncIterator[str]:
    """``app`` on uvicorn over TLS on a loopback socket bound first; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        log_level="warning",
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="https-documents")
    try:
        yield f"https://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = server.force_exit = True
        await asyncio.wait_for(serving, bound(10))
        sock.close()


# --- an app's part by hand (for the refusals the SDK would never provoke) ----------------------


def pkce() -> tuple[str, str]:
    """A PKCE verifier and its S256 challenge."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    return verifier, challenge.decode().rstrip("=")


async def register(http: httpx2.AsyncClient, redirect: str, name: str = "Manual app") -> Any:
    """Register an app (RFC 7591) as a public client; returns the gateway's answer (JSON)."""
    answer = await http.post(
        "/register",
        json={
            "client_name": name,
            "redirect_uris": [redirect],
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        },
    )
    assert answer.status_code == 201, answer.text
    return answer.json()


def authorize_url(base: str, client_id: str, redirect: str, challenge: str, **extra: str) -> str:
    """The /authorize URL an app sends the owner's browser to."""
    query = {
        "response_type": "code",
        "client_id": client_id,
        "redirect_uri": redirect,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        "state": "st4te",
        **extra,
    }
    return f"{base}/authorize?{urllib.parse.urlencode(query)}"


@dataclass
class ManualGrant:
    """A registered app, the code the owner's consent gave it, and its PKCE verifier."""

    client_id: str
    redirect: str
    code: str
    verifier: str

    def redeem_form(self, **changes: str) -> dict[str, str]:
        """The token request's form (``changes`` replace or add fields; "" drops one)."""
        form = {
            "grant_type": "authorization_code",
            "code": self.code,
            "client_id": self.client_id,
            "redirect_uri": self.redirect,
            "code_verifier": self.verifier,
            **changes,
        }
        return {key: value for key, value in form.items() if value != ""}


class Granting(NamedTuple):
    """What a test of an app's grant needs: ``async with granting(...) as (run, callback,
    owner, http)``."""

    run: Running
    callback: Callback
    owner: ConsentBrowser
    http: httpx2.AsyncClient


@asynccontextmanager
async def granting(data_dir: Path, **overrides: Any) -> AsyncIterator[Granting]:
    """An OAuth gateway, an app's redirect URI, the owner in Chromium, and an HTTP client."""
    async with (
        oauth_gateway(data_dir, **overrides) as run,
        callback_server() as callback,
        consent_browser() as owner,
        http_to(run) as http,
    ):
        yield Granting(run, callback, owner, http)


async def manual_grant(
    http: httpx2.AsyncClient, owner: ConsentBrowser, callback: Callback, base: str, **extra: str
) -> ManualGrant:
    """Register, send Chromium through consent, and return the code it brought back."""
    client = await register(http, callback.url)
    verifier, challenge = pkce()
    await owner.consent(authorize_url(base, client["client_id"], callback.url, challenge, **extra))
    query = await callback.next()
    return ManualGrant(client["client_id"], callback.url, query["code"], verifier)
