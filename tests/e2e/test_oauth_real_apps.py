"""The real apps' sign-in, as each sends it (shared/reference/field-notes.md has the facts):
Claude Code by its own client metadata document with an ephemeral loopback port, Home Assistant
2026.11 with app credentials and no PKCE, Home Assistant core's next release with registration
and PKCE (through the LAN URL while ``[host] public_url`` is set, and with a plain-HTTP LAN
redirect). The owner is headless Chromium on the real consent page; each flow ends in a working
``tools/list``."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import pty
import re
import secrets
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientMetadata
from playwright.async_api import Route
from pydantic import AnyUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route as StarletteRoute

from gateway.host_side.oauth import client_documents
from gateway.host_side.oauth.client_documents import ClientDocuments
from tests.conftest import asgi_server, bound
from tests.e2e.helpers import listed_device
from tests.e2e.test_oauth import signed_in_dashboard
from tests.e2e.test_oauth_js import node, npm_package
from tests.e2e.test_stdio_and_cli import cli, cli_env
from tests.oauth_helpers import (
    ADMIN,
    HOST_TOKEN,
    ConsentBrowser,
    MemoryStorage,
    authorize_url,
    base_url,
    callback_server,
    consent_browser,
    http_to,
    https_server,
    oauth_gateway,
    pkce,
    register,
    self_signed,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM = "02:00:00:00:00:01"
VOLUME = "sim-esp32_0001_audio_speaker_set_volume"
MY_REDIRECT = "https://my.home-assistant.io/redirect/oauth"  # HA's MY_AUTH_CALLBACK_PATH
HA_CALLBACK_PATH = "/auth/external/callback"  # HA's AUTH_CALLBACK_PATH (no `my` integration)


# --- Claude Code ---------------------------------------------------------------------------


def claude_code_document(url: str) -> dict[str, Any]:
    """The shape of https://claude.ai/oauth/claude-code-client-metadata (Claude Code 2.1.x):
    port-less loopback redirect URIs, a public client."""
    return {
        "client_id": url,
        "client_name": "Claude Code",
        "client_uri": "https://claude.ai",
        "redirect_uris": ["http://localhost/callback", "http://127.0.0.1/callback"],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }


async def test_claude_code_signs_in_by_its_document_with_an_ephemeral_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code's identity: a metadata document listing port-less loopback redirect URIs,
    an authorize request with ``redirect_uri=http://localhost:<ephemeral port>/callback``
    (RFC 8252 §7.3: any port), PKCE S256; the owner allows it, the app lists and calls tools,
    and the grant remembers the port it was sent to."""
    cert, key = self_signed(tmp_path / "tls")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    document: dict[str, Any] = {}

    async def serve(request: Request) -> JSONResponse:
        return JSONResponse(document)

    app = Starlette(routes=[StarletteRoute("/oauth/claude-code-client-metadata", serve)])
    async with (
        https_server(app, cert, key) as documents,
        oauth_gateway(tmp_path / "data", oauth_metadata_networks=("127.0.0.0/8",)) as run,
        listed_device(run, SIM) as dev,
        callback_server() as callback,
        consent_browser() as owner,
    ):
        url = f"{documents}/oauth/claude-code-client-metadata"
        document.update(claude_code_document(url))
        port = urllib.parse.urlsplit(callback.url).port
        redirect = f"http://localhost:{port}/callback"  # as Claude Code sends it
        auth = OAuthClientProvider(
            run.mcp_url,
            OAuthClientMetadata(
                client_name="Claude Code",
                redirect_uris=[AnyUrl(redirect)],
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                token_endpoint_auth_method="none",
            ),
            MemoryStorage(),
            redirect_handler=owner.consent,
            callback_handler=callback.result,
            client_metadata_url=url,
        )
        async with httpx2.AsyncClient(auth=auth, timeout=bound(30)) as http:
            async with Client(streamable_http_client(run.mcp_url, http_client=http)) as client:
                assert VOLUME in [tool.name for tool in (await client.list_tools()).tools]
                assert not (await client.call_tool(VOLUME, {"volume": 3})).is_error
        assert ("self.audio_speaker.set_volume", {"volume": 3}) in dev.calls
        async with http_to(run) as admin:
            apps = (await admin.get("/api/oauth/apps", headers=ADMIN)).json()["apps"]
    assert [(a["client_id"], a["redirect"]) for a in apps] == [(url, redirect)]


# --- Home Assistant: what its MCP client sends -------------------------------------------------


def ha_state(redirect_uri: str) -> str:
    """A JWT like HA's ``_encode_jwt(hass, {"flow_id", "redirect_uri"})`` (HS256; ~200 chars)."""

    def part(value: bytes) -> str:
        return base64.urlsafe_b64encode(value).decode().rstrip("=")

    head = part(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = {"flow_id": secrets.token_hex(16), "redirect_uri": redirect_uri,
              "exp": int(time.time()) + 600}  # fmt: skip
    body = part(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(secrets.token_bytes(32), f"{head}.{body}".encode(), hashlib.sha256)
    return f"{head}.{body}.{part(signature.digest())}"


class HomeAssistant:
    """The HTTP requests of Home Assistant's MCP client, replayed: discovery
    (``config_flow.py``: 401 ``resource_metadata``, then the protected-resource metadata, whose
    ``resource`` must equal the typed URL, then ``/.well-known/oauth-authorization-server`` and
    ``/.well-known/openid-configuration`` at once), the authorize URL and the token requests of
    ``helpers/config_entry_oauth2_flow.py`` (``LocalOAuth2Implementation``)."""

    def __init__(self, http: httpx2.AsyncClient, typed_url: str) -> None:
        self.http, self.url = http, typed_url
        self.metadata: dict[str, Any] = {}
        self.scopes: list[str] = []
        self.client_id = ""  # registered (next release) or typed in (2026.11)

    async def discover(self) -> None:
        """From the typed URL to the authorization server's metadata."""
        probe = await self.http.post(
            self.url,
            json={"jsonrpc": "2.0", "id": 0, "method": "initialize",
                  "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                             "clientInfo": {"name": "home-assistant", "version": "1"}}},
            headers={"Accept": "application/json, text/event-stream"},
        )  # fmt: skip
        assert probe.status_code == 401, probe.text
        challenge = probe.headers["www-authenticate"]
        pointer = challenge.split('resource_metadata="', 1)[1].split('"', 1)[0]
        document = (await self.http.get(pointer)).json()
        # config_flow.py _resource_metadata_from_document: `resource != mcp_server_url` aborts
        # the flow ("OAuth resource metadata is invalid")
        assert document["resource"] == self.url
        self.scopes = document.get("scopes_supported") or []
        server = urllib.parse.urlsplit(document["authorization_servers"][0])
        root = f"{server.scheme}://{server.netloc}"
        answers = await asyncio.gather(
            self.http.get(f"{root}/.well-known/oauth-authorization-server"),
            self.http.get(f"{root}/.well-known/openid-configuration"),
        )
        self.metadata = next(a for a in answers if a.status_code == 200).json()

    def authorize(self, client_id: str, redirect_uri: str, **extra: str) -> str:
        """``async_generate_authorize_url`` and the flow handler's ``extra_authorize_data``."""
        query = {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "state": ha_state(redirect_uri),
            **extra,  # PKCE, from LocalOAuth2ImplementationWithPkce (next release only)
            "access_type": "offline",
            "prompt": "consent",
            "scope": " ".join(self.scopes),
        }
        return f"{self.metadata['authorization_endpoint']}?{urllib.parse.urlencode(query)}"

    async def token(self, client_id: str, secret: str, **data: str) -> httpx2.Response:
        """``_token_request``: ``client_id`` (and ``client_secret`` when set) in the form."""
        form = {**data, "client_id": client_id}
        if secret:
            form["client_secret"] = secret
        return await self.http.post(self.metadata["token_endpoint"], data=form)

    async def tools(self, token: str) -> list[str]:
        """The tool names, as HA's MCP client lists them (the SDK's streamable client)."""
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=bound(30)) as http:
            async with Client(streamable_http_client(self.url, http_client=http)) as client:
                return [tool.name for tool in (await client.list_tools()).tools]


async def ha_consent(owner: ConsentBrowser, url: str, redirect: str) -> dict[str, str]:
    """Chromium's Allow for HA, and the query its redirect carries. The browser never leaves
    for ``my.home-assistant.io`` (the answer's redirect is read, not followed: no name outside
    this machine is even resolved); a LAN redirect is followed to the test's HA."""
    context = await owner.browser.new_context()
    sent_to: list[str] = []

    async def consent_answer(route: Route) -> None:
        if route.request.method != "POST":
            await route.continue_()
            return
        response = await route.fetch(max_redirects=0)
        sent_to.append(response.headers["location"])
        if sent_to[-1].startswith(MY_REDIRECT):
            await route.fulfill(status=200, body="sent to my.home-assistant.io")
        else:
            await route.fulfill(response=response)

    await context.route("**/consent", consent_answer)
    page = await owner.open(url, context)
    await owner.answer(page)
    assert sent_to and sent_to[-1].split("?")[0] == redirect
    if not sent_to[-1].startswith(MY_REDIRECT):
        assert page.url == sent_to[-1]  # the browser reached HA itself
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(sent_to[-1]).query))


async def make_credentials(
    http: httpx2.AsyncClient, redirect: str, no_pkce: bool, name: str = "Home Assistant"
) -> dict[str, Any]:
    """App credentials made by the owner (the dashboard's Connected apps calls this API)."""
    answer = await http.post(
        "/api/oauth/credentials",
        json={"name": name, "redirect_uri": redirect, "no_pkce": no_pkce},
        headers=ADMIN,
    )
    assert answer.status_code == 201, answer.text
    return answer.json()  # type: ignore[no-any-return]


async def test_home_assistant_2026_11_with_app_credentials_and_no_pkce(tmp_path: Path) -> None:
    """HA 2026.11.0 (PyPI): the owner makes app credentials marked "cannot send PKCE" for the
    redirect URI HA shows; HA's authorize request has no code_challenge, its token request the
    secret in the form (client_secret_post); tools list; a refresh works; a wrong secret and a
    Basic header with the wrong secret are refused, the right one in Basic accepted."""
    async with (
        oauth_gateway(tmp_path) as run,
        listed_device(run, SIM),
        consent_browser() as owner,
        http_to(run) as http,
    ):
        made = await make_credentials(http, MY_REDIRECT, no_pkce=True)
        client_id, secret = made["client_id"], made["client_secret"]
        listed = (await http.get("/api/oauth/credentials", headers=ADMIN)).json()
        assert [c["client_id"] for c in listed["credentials"]] == [client_id]
        assert secret not in json.dumps(listed)  # shown once, at creation only
        ha = HomeAssistant(http, run.mcp_url)
        await ha.discover()
        query = await ha_consent(owner, ha.authorize(client_id, MY_REDIRECT), MY_REDIRECT)
        code = {"grant_type": "authorization_code", "code": query["code"],
                "redirect_uri": MY_REDIRECT}  # fmt: skip
        wrong = await ha.token(client_id, "gws_not-the-secret", **code)
        tokens = await ha.token(client_id, secret, **code)
        assert tokens.status_code == 200, tokens.text
        assert VOLUME in await ha.tools(tokens.json()["access_token"])
        refresh = {"grant_type": "refresh_token", "refresh_token": tokens.json()["refresh_token"]}
        basic_wrong = await http.post(
            "/token", data={**refresh, "client_id": client_id},
            auth=httpx2.BasicAuth(client_id, "gws_wrong"),
        )  # fmt: skip
        refreshed = await http.post(
            "/token", data=refresh, auth=httpx2.BasicAuth(client_id, secret)
        )  # client_secret_basic, without client_id in the form
        assert refreshed.status_code == 200, refreshed.text
        assert VOLUME in await ha.tools(refreshed.json()["access_token"])
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_client"
    assert basic_wrong.status_code == 401


async def test_home_assistant_next_release_registers_with_pkce_on_the_lan_url(
    tmp_path: Path,
) -> None:
    """HA core main (``registration.py``, ``MCPAuthImplementation`` with PKCE): with ``[host]
    public_url`` set for a tunnel, HA typing the gateway's own (LAN) URL is told that very URL
    as the resource; it registers (RFC 7591, ``application_type: web``, auth method ``none``),
    authorizes with PKCE, ``access_type=offline&prompt=consent``, a JWT state and no
    ``resource``, and lists tools. The same gateway still names the public URL to the tunnel."""
    public = "https://devices.example.com"
    async with (
        oauth_gateway(tmp_path, host_public_url=public,
                      host_allowed_hosts=("devices.example.com",)) as run,
        listed_device(run, SIM),
        consent_browser() as owner,
        http_to(run) as http,
    ):  # fmt: skip
        ha = HomeAssistant(http, run.mcp_url)
        await ha.discover()
        assert ha.metadata["issuer"] == base_url(run)
        tokens = await ha_next_release_flow(ha, owner, MY_REDIRECT)
        assert VOLUME in await ha.tools(tokens["access_token"])
        refreshed = await ha.token(ha.client_id, "", grant_type="refresh_token",
                                   refresh_token=tokens["refresh_token"])  # fmt: skip
        assert refreshed.status_code == 200, refreshed.text
        tunnel = await http.get(
            "/.well-known/oauth-protected-resource/mcp", headers={"Host": "devices.example.com"}
        )
        assert tunnel.json()["resource"] == f"{public}/mcp"
        lan_token = await http.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={"Host": "devices.example.com", "Accept": "application/json, text/event-stream",
                     "Authorization": f"Bearer {tokens['access_token']}"},
        )  # fmt: skip
    assert lan_token.status_code == 401  # bound to the LAN resource it was issued for


async def ha_next_release_flow(
    ha: HomeAssistant, owner: ConsentBrowser, redirect: str
) -> dict[str, Any]:
    """Registration, consent and code exchange as HA core main sends them."""
    methods = ha.metadata.get("token_endpoint_auth_methods_supported")
    method = "none" if methods is None or "none" in methods else "client_secret_post"
    payload = OAuthClientMetadata(
        redirect_uris=[AnyUrl(redirect)],
        token_endpoint_auth_method=method,  # type: ignore[arg-type]
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        client_name="Home Assistant",
        scope=" ".join(ha.scopes) or None,
    ).model_dump(mode="json", exclude_none=True)
    payload["application_type"] = "web"
    registered = await ha.http.post(
        ha.metadata["registration_endpoint"], json=payload, headers={"Accept": "application/json"}
    )
    assert registered.status_code in (200, 201), registered.text
    ha.client_id = registered.json()["client_id"]
    verifier = secrets.token_urlsafe(96)[:128]  # generate_code_verifier(128)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
    url = ha.authorize(ha.client_id, redirect, code_challenge=challenge.decode().rstrip("="),
                       code_challenge_method="S256")  # fmt: skip
    assert "resource=" not in url
    query = await ha_consent(owner, url, redirect)
    tokens = await ha.token(ha.client_id, "", grant_type="authorization_code",
                            code=query["code"], redirect_uri=redirect,
                            code_verifier=verifier)  # fmt: skip
    assert tokens.status_code == 200, tokens.text
    return tokens.json()  # type: ignore[no-any-return]


@asynccontextmanager
async def ha_on_the_lan() -> AsyncIterator[str]:
    """HA's own web server without ``my`` (at 127.0.0.5, the LAN address in this test):
    ``/auth/external/callback`` answers; yields the redirect URI HA shows."""

    async def callback(request: Request) -> PlainTextResponse:
        return PlainTextResponse("Home Assistant: you can close this window")

    app = Starlette(routes=[StarletteRoute(HA_CALLBACK_PATH, callback)])
    async with asgi_server(app, "home-assistant", host="127.0.0.5") as base:
        yield f"{base}{HA_CALLBACK_PATH}"


async def test_home_assistant_without_my_uses_a_plain_http_lan_redirect(tmp_path: Path) -> None:
    """HA without its ``my`` integration returns to ``http://<HA address>/auth/external/callback``:
    registration accepts that plain-HTTP redirect for an address on ``[oauth] http_networks``,
    and the flow (HA core main) ends in tools."""
    async with (
        ha_on_the_lan() as redirect,
        oauth_gateway(tmp_path, oauth_http_networks=("127.0.0.0/8",)) as run,
        listed_device(run, SIM),
        consent_browser() as owner,
        http_to(run) as http,
    ):
        ha = HomeAssistant(http, run.mcp_url)
        await ha.discover()
        tokens = await ha_next_release_flow(ha, owner, redirect)
        assert VOLUME in await ha.tools(tokens["access_token"])


# --- refusals ------------------------------------------------------------------------------


async def test_plain_http_lan_redirect_is_refused_off_the_listed_networks(tmp_path: Path) -> None:
    """Without the network in ``[oauth] http_networks``, the same plain-HTTP redirect is refused
    at registration and when the owner makes credentials."""
    redirect = f"http://127.0.0.5:8123{HA_CALLBACK_PATH}"
    async with oauth_gateway(tmp_path, oauth_http_networks=("10.9.0.0/16",)) as run:
        async with http_to(run) as http:
            registered = await http.post(
                "/register", json={"client_name": "HA", "redirect_uris": [redirect],
                                   "token_endpoint_auth_method": "none"},
            )  # fmt: skip
            credentials = await http.post(
                "/api/oauth/credentials",
                json={"name": "HA", "redirect_uri": redirect, "no_pkce": True},
                headers=ADMIN,
            )
    assert registered.status_code == 400
    assert "http_networks" in registered.json()["error_description"]
    assert credentials.status_code == 400 and "http_networks" in credentials.json()["error"]


async def test_loopback_port_freedom_keeps_host_and_path_and_the_token_request_agrees(
    tmp_path: Path,
) -> None:
    """A port-less loopback redirect URI accepts any port, never another path or host; the
    token request must repeat the redirect URI the code was sent to, port and all."""
    async with (
        oauth_gateway(tmp_path) as run,
        callback_server() as callback,
        consent_browser() as owner,
        http_to(run) as http,
    ):
        client = await register(http, "http://127.0.0.1/callback")
        verifier, challenge = pkce()
        port = urllib.parse.urlsplit(callback.url).port
        refused = [
            await http.get(authorize_url(base_url(run), client["client_id"], uri, challenge))
            for uri in (f"http://127.0.0.1:{port}/other", f"http://localhost:{port}/callback",
                        f"https://127.0.0.1:{port}/callback")
        ]  # fmt: skip
        await owner.consent(authorize_url(base_url(run), client["client_id"], callback.url,
                                          challenge))  # fmt: skip
        code = (await callback.next())["code"]
        form = {"grant_type": "authorization_code", "code": code, "code_verifier": verifier,
                "client_id": client["client_id"]}  # fmt: skip
        portless = await http.post(
            "/token", data={**form, "redirect_uri": "http://127.0.0.1/callback"}
        )
        exact = await http.post("/token", data={**form, "redirect_uri": callback.url})
    for answer in refused:
        assert answer.status_code == 400 and "not registered" in answer.text
    assert portless.status_code == 400 and "redirect_uri" in portless.text
    assert exact.status_code == 200, exact.text


async def test_no_pkce_only_for_credentials_the_owner_marked(tmp_path: Path) -> None:
    """An authorization request without PKCE is refused for registered apps and for app
    credentials not marked "cannot send PKCE"; marked ones match their redirect exactly (no
    loopback port freedom), and their token request needs the secret."""
    async with oauth_gateway(tmp_path) as run, http_to(run) as http:
        unmarked = await make_credentials(http, MY_REDIRECT, no_pkce=False)
        marked = await make_credentials(http, "http://127.0.0.1/callback", no_pkce=True)
        registered = await register(http, MY_REDIRECT)

        def without_pkce(client_id: str, redirect: str) -> str:
            query = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect,
                     "state": "s"}  # fmt: skip
            return f"/authorize?{urllib.parse.urlencode(query)}"

        answers = {
            "unmarked": await http.get(without_pkce(unmarked["client_id"], MY_REDIRECT)),
            "registered": await http.get(without_pkce(registered["client_id"], MY_REDIRECT)),
            "marked, other port": await http.get(
                without_pkce(marked["client_id"], "http://127.0.0.1:4000/callback")
            ),
        }
        marked_ok = await http.get(without_pkce(marked["client_id"], "http://127.0.0.1/callback"))
    for what in ("unmarked", "registered"):
        answer = answers[what]
        assert answer.status_code in (302, 400), what
        said = answer.headers.get("location", "") + answer.text
        assert "code_challenge" in urllib.parse.unquote_plus(said), what
        assert "/consent" not in said, what
    assert answers["marked, other port"].status_code == 400
    assert marked_ok.status_code == 302 and "consent?request=" in marked_ok.headers["location"]


async def test_cli_makes_lists_and_deletes_app_credentials(tmp_path: Path) -> None:
    """``esp-mcp-gateway credentials add NAME --redirect-uri URI --no-pkce`` prints a client id
    and a secret that authenticates at the token endpoint; ``list`` shows them (no secret);
    ``delete`` ends them."""
    async with oauth_gateway(tmp_path / "data") as run, http_to(run) as http:
        env = cli_env(tmp_path / "cli")
        where = ("--url", base_url(run), "--token", HOST_TOKEN)
        code, out, err = await cli("credentials", "add", "Home Assistant", "--redirect-uri",
                                   MY_REDIRECT, "--no-pkce", *where, env=env)  # fmt: skip
        assert code == 0, err
        printed = dict(line.split(":", 1) for line in out.splitlines() if line.startswith("client"))
        client_id, secret = printed["client id"].strip(), printed["client secret"].strip()
        form = {"grant_type": "authorization_code", "code": "gwc_none", "client_id": client_id,
                "redirect_uri": MY_REDIRECT}  # fmt: skip
        known = await http.post("/token", data={**form, "client_secret": secret})
        _, listed, _ = await cli("credentials", "list", *where, env=env)
        code, _, err = await cli("credentials", "delete", client_id, *where, env=env)
        assert code == 0, err
        gone = await http.post("/token", data={**form, "client_secret": secret})
    assert known.status_code == 400 and known.json()["error"] == "invalid_grant"  # signed in
    assert client_id in listed and "no PKCE" in listed and secret not in listed
    assert gone.status_code == 401


async def test_owner_makes_app_credentials_on_connected_apps(tmp_path: Path) -> None:
    """On the dashboard's Connected apps the owner makes credentials (name, the redirect URI
    the app shows, "cannot send PKCE"), sees the secret once, and deletes them again; the
    secret shown authenticates at the token endpoint, and no longer after Delete."""
    async with (
        oauth_gateway(tmp_path) as run,
        consent_browser() as owner,
        http_to(run) as http,
    ):
        page = await signed_in_dashboard(owner, run, "#apps")
        await page.fill('#add-credentials input[name="name"]', "Home Assistant")
        await page.fill('#add-credentials input[name="redirect_uri"]', MY_REDIRECT)
        await page.check('#add-credentials input[name="no_pkce"]')
        await page.click("#add-credentials button[type=submit]")
        await page.wait_for_selector("#credentials-made:not([hidden])")
        shown = await page.inner_text("#credentials-made")
        printed = dict(
            line.split(":", 1) for line in shown.splitlines() if line.startswith("client")
        )
        client_id, secret = printed["client id"].strip(), printed["client secret"].strip()
        row = page.locator(f'#credentials tr[data-client="{client_id}"]')
        await row.wait_for()
        row_text = await row.inner_text()
        form = {"grant_type": "authorization_code", "code": "gwc_none", "client_id": client_id,
                "client_secret": secret, "redirect_uri": MY_REDIRECT}  # fmt: skip
        known = await http.post("/token", data=form)
        await row.locator("button.delete").click()
        await page.wait_for_selector("#credentials-empty:not([hidden])")
        gone = await http.post("/token", data=form)
    assert "Home Assistant" in row_text and "not sent" in row_text and secret not in row_text
    assert known.status_code == 400 and known.json()["error"] == "invalid_grant"  # signed in
    assert gone.status_code == 401


# --- the Claude Code CLI itself ----------------------------------------------------------------

CLAUDE_CODE_ID = "https://claude.ai/oauth/claude-code-client-metadata"
_AUTHORIZE = re.compile(r"(http://127\.0\.0\.1:\d+/authorize\?[^\s\x07\x1b]+)")


class Terminal:
    """A program on a pseudo-terminal (``claude mcp login`` wants one): what it printed so far,
    read until a pattern shows."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        os.set_blocking(self.master, False)
        self.text = ""

    async def until(self, pattern: re.Pattern[str], seconds: float) -> re.Match[str]:
        """The first match of ``pattern`` in the output, waiting at most ``seconds``."""
        try:
            with anyio.fail_after(bound(seconds)):
                while (found := pattern.search(self.text)) is None:
                    await anyio.wait_readable(self.master)
                    try:
                        chunk = os.read(self.master, 65536)
                    except BlockingIOError:
                        continue
                    except OSError:  # the program ended and closed its side
                        chunk = b""
                    if not chunk:
                        raise AssertionError(f"ended without {pattern.pattern!r}")
                    self.text += chunk.decode("utf-8", "replace")
        except (TimeoutError, AssertionError) as exc:
            raise AssertionError(f"{exc}; the terminal showed: {self.text!r}") from None
        return found

    def close(self) -> None:
        """Close both ends."""
        for fd in (self.master, self.slave):
            with suppress(OSError):
                os.close(fd)


async def test_claude_code_cli_mcp_login_ends_authenticated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code 2.1.332 (npm) itself: ``claude mcp add --transport http`` then ``claude mcp
    login`` on a pseudo-terminal, offline. The gateway fetches Claude Code's metadata document
    from a replica (its own TLS certificate for claude.ai; the name and port lead to the test's
    server); Chromium allows the request Claude Code prints; Claude Code ends signed in, and
    the grant returns to its ephemeral localhost port."""
    package = npm_package("@anthropic-ai/claude-code")
    cert, key = self_signed(tmp_path / "tls", names=("claude.ai",))
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))

    async def serve(request: Request) -> JSONResponse:
        return JSONResponse(claude_code_document(CLAUDE_CODE_ID))

    app = Starlette(routes=[StarletteRoute("/oauth/claude-code-client-metadata", serve)])
    async with https_server(app, cert, key) as replica:
        replica_port = urllib.parse.urlsplit(replica).port

        async def to_replica(self: ClientDocuments, host: str, port: int) -> str:
            assert (host, port) == ("claude.ai", 443)  # nothing else is fetched
            return "127.0.0.1"

        # claude.ai resolves to the replica, and its port 443 is the replica's (the TLS
        # handshake and the Host header still name claude.ai)
        monkeypatch.setattr(ClientDocuments, "checked_address", to_replica)
        monkeypatch.setattr(
            client_documents, "host_port", lambda _a, _p: f"127.0.0.1:{replica_port}"
        )
        async with (
            oauth_gateway(tmp_path / "data") as run,
            listed_device(run, SIM),
            consent_browser() as owner,
            http_to(run) as http,
        ):
            home, project = tmp_path / "home", tmp_path / "project"
            project.mkdir()
            env = {"PATH": os.environ["PATH"], "HOME": str(home), "TERM": "xterm",
                   "BROWSER": "/bin/false", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                   "DISABLE_AUTOUPDATER": "1"}  # fmt: skip
            claude = [node(), str(package / "cli-wrapper.cjs")]
            added = await anyio.run_process(
                [*claude, "mcp", "add", "--transport", "http", "esp", run.mcp_url],
                cwd=project, env=env, check=False,
            )  # fmt: skip
            assert added.returncode == 0, added.stderr
            terminal = Terminal()
            try:
                async with await anyio.open_process(
                    [*claude, "mcp", "login", "esp"], cwd=project, env=env,
                    stdin=terminal.slave, stdout=terminal.slave, stderr=terminal.slave,
                ) as login:  # fmt: skip
                    url = (await terminal.until(_AUTHORIZE, 60))[1]
                    await owner.consent(url)
                    await terminal.until(re.compile(r'Authenticated with "esp"'), 30)
                    with anyio.fail_after(bound(20)):
                        await login.wait()
            finally:
                terminal.close()
            apps = (await http.get("/api/oauth/apps", headers=ADMIN)).json()["apps"]
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    assert query["client_id"] == CLAUDE_CODE_ID
    assert re.fullmatch(r"http://localhost:\d+/callback", query["redirect_uri"])
    assert [(a["client_id"], a["redirect"]) for a in apps] == [
        (CLAUDE_CODE_ID, query["redirect_uri"])
    ]
    assert "Couldn't" not in terminal.text
