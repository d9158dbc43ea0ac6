"""OAuth end to end: the MCP Python SDK's own OAuth client against a real gateway, the owner's
consent given by headless Chromium on the real consent page, then tools listed and called on a
simulated device, and Revoke on the dashboard ending the app's access and its open stream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from playwright.async_api import Page
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.app import Running
from gateway.host_side.oauth.store import REFRESH_GRACE
from tests.conftest import bound
from tests.e2e.helpers import listed_device
from tests.oauth_helpers import (
    ADMIN,
    HOST_TOKEN,
    STREAM,
    ConsentBrowser,
    MemoryStorage,
    base_url,
    callback_server,
    consent_browser,
    http_to,
    https_server,
    mcp_with,
    oauth_gateway,
    sdk_auth,
    sdk_client,
    self_signed,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM = "02:00:00:00:00:01"
VOLUME = "sim-esp32_0001_audio_speaker_set_volume"
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def audit_records(run: Running, data_dir: Path) -> list[dict[str, Any]]:
    run.gateway.audit.flush()
    lines = (data_dir / "audit.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


async def signed_in_dashboard(owner: ConsentBrowser, run: Running, path: str) -> Page:
    """The dashboard in Chromium, signed in with the host token, at ``path`` (``#apps``)."""
    page = await owner.open(f"{base_url(run)}/login")
    await page.fill("#token", HOST_TOKEN)
    await page.click("#login button[type=submit]")
    await page.wait_for_selector("#live.on")
    await page.goto(f"{base_url(run)}/{path}")
    return page


async def open_stream(http: httpx2.AsyncClient, token: str) -> httpx2.Response:
    """A legacy MCP session's standalone GET stream, opened with an app's token."""
    auth = {**STREAM, "Authorization": f"Bearer {token}"}
    init = await mcp_with(http, token)
    assert init.status_code == 200, init.text
    session = {
        **auth,
        "mcp-session-id": init.headers["mcp-session-id"],
        "mcp-protocol-version": "2025-06-18",
    }
    await http.post(
        "/mcp", headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
    )
    request = http.build_request("GET", "/mcp", headers={**session, "Accept": "text/event-stream"})
    response = await http.send(request, stream=True)
    assert response.status_code == 200
    return response


async def test_sdk_client_registers_gets_consent_calls_a_tool_and_is_revoked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Dynamic registration, Chromium's Allow, a tool call that reaches the device and is
    audited with the app as caller; Revoke on the dashboard ends the app's open stream at once
    and makes its token a 401 with the resource_metadata pointer."""
    storage = MemoryStorage()
    async with (
        oauth_gateway(tmp_path) as run,
        listed_device(run, SIM) as dev,
        callback_server() as callback,
        consent_browser() as owner,
    ):
        auth = sdk_auth(run, owner, callback, name="Porch lamp helper", storage=storage)
        async with sdk_client(run, auth) as client:
            assert VOLUME in [tool.name for tool in (await client.list_tools()).tools]
            result = await client.call_tool(VOLUME, {"volume": 42})
            assert not result.is_error
        assert ("self.audio_speaker.set_volume", {"volume": 42}) in dev.calls
        assert callback.received[0]["iss"] == base_url(run)  # RFC 9207
        assert storage.tokens is not None and storage.client is not None
        token = storage.tokens.access_token
        async with http_to(run) as http:
            stream = await open_stream(http, token)
            sessions = run.gateway._manager._session_owners  # the SDK's record of who opened each
            assert [o for o in sessions.values() if o["client_id"] == storage.client.client_id]
            page = await signed_in_dashboard(owner, run, "#apps")
            row = page.locator(f'#apps tr[data-client="{storage.client.client_id}"]')
            assert await row.locator(".name").inner_text() == "Porch lamp helper"
            await row.locator("button.revoke").click()
            await page.wait_for_selector("#apps-empty:not([hidden])")
            with anyio.fail_after(bound(5)):  # the open stream ends at once, and properly
                async for _ in stream.aiter_bytes():  # (a cut stream raises RemoteProtocolError)
                    pass
            assert not [o for o in sessions.values() if o["client_id"] == storage.client.client_id]
            after = await mcp_with(http, token, TOOLS_LIST)
        assert after.status_code == 401
        metadata = f"{base_url(run)}/.well-known/oauth-protected-resource/mcp"
        assert f'resource_metadata="{metadata}"' in after.headers["www-authenticate"]
        records = audit_records(run, tmp_path)
    actions = {r["action"] for r in records if r["kind"] == "oauth"}
    assert {"register", "grant", "revoke"} <= actions
    assert not [r for r in caplog.records if "without completing response" in r.getMessage()]
    call = next(r for r in records if r["kind"] == "call")
    assert "Porch lamp helper" in call["caller"] and storage.client.client_id in call["caller"]


async def test_sdk_client_by_client_metadata_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app identified by an https client metadata document (served by the test over TLS,
    its self-signed certificate trusted through SSL_CERT_FILE) gets in with consent, no
    registration, and the consent page names it as its document does."""
    cert, key = self_signed(tmp_path / "tls")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    document: dict[str, object] = {}

    async def serve(request: Request) -> JSONResponse:
        return JSONResponse(document)

    app = Starlette(routes=[Route("/client.json", serve)])
    async with (
        https_server(app, cert, key) as documents,
        oauth_gateway(tmp_path / "data", oauth_metadata_networks=("127.0.0.0/8",)) as run,
        listed_device(run, SIM),
        callback_server() as callback,
        consent_browser() as owner,
    ):
        url = f"{documents}/client.json"
        document.update(
            client_id=url,
            client_name="Document app",
            redirect_uris=[callback.url],
            token_endpoint_auth_method="none",
        )
        storage = MemoryStorage()
        auth = sdk_auth(run, owner, callback, metadata_url=url, storage=storage)
        async with sdk_client(run, auth) as client:
            result = await client.call_tool(VOLUME, {"volume": 7})
            assert not result.is_error
        assert storage.client is not None and storage.client.client_id == url
        async with http_to(run) as http:
            apps = (await http.get("/api/oauth/apps", headers=ADMIN)).json()["apps"]
            registered = await http.get("/api/oauth/apps", headers=ADMIN)
        assert registered.status_code == 200
    assert [(a["client_id"], a["name"]) for a in apps] == [(url, "Document app")]


async def test_signed_in_dashboard_session_counts_on_the_consent_page(tmp_path: Path) -> None:
    """An owner already signed in to the dashboard in this browser just presses Allow."""
    storage = MemoryStorage()
    async with (
        oauth_gateway(tmp_path) as run,
        callback_server() as callback,
        consent_browser() as owner,
    ):
        dashboard = await signed_in_dashboard(owner, run, "#apps")
        owner.token = None  # would fail the flow if the page asked for it

        async def redirect(url: str) -> None:
            page = await owner.open(url, dashboard.context)
            await page.wait_for_selector("#allow")
            assert await page.locator('input[name="token"]').count() == 0
            async with page.expect_navigation():
                await page.click("#allow")

        auth = sdk_auth(run, owner, callback, storage=storage)
        auth.context.redirect_handler = redirect
        async with sdk_client(run, auth) as client:
            await client.list_tools()
    assert storage.tokens is not None


async def test_refresh_rotates_and_tokens_survive_a_restart(tmp_path: Path) -> None:
    """Tokens are kept (hashed) in the data dir: after a restart the app's refresh token still
    works: the new pair replaces it (the same pair again within the grace period), and the old
    one presented after that revokes the grant. Refreshes are audited in audit.log only, never
    in the owner's admin log."""
    storage = MemoryStorage()
    async with (
        callback_server() as callback,
        consent_browser() as owner,
    ):
        async with oauth_gateway(tmp_path) as run:
            async with sdk_client(run, sdk_auth(run, owner, callback, storage=storage)) as client:
                await client.list_tools()
        assert storage.tokens is not None and storage.client is not None
        old_refresh = storage.tokens.refresh_token
        assert old_refresh and old_refresh not in (tmp_path / "oauth.sqlite3").read_bytes().decode(
            "latin-1"
        )
        async with oauth_gateway(tmp_path) as run:
            form = {
                "grant_type": "refresh_token",
                "refresh_token": old_refresh,
                "client_id": storage.client.client_id,
                "client_secret": storage.client.client_secret or "",
            }
            async with http_to(run) as http:
                fresh = await http.post("/token", data=form)
                again = await http.post("/token", data=form)
                store = run.gateway.oauth.store  # type: ignore[union-attr]
                clock = store.clock
                store.clock = lambda: clock() + REFRESH_GRACE + 1
                replay = await http.post("/token", data=form)
                following = await http.post(
                    "/token", data={**form, "refresh_token": fresh.json()["refresh_token"]}
                )
            records = audit_records(run, tmp_path)
    assert fresh.status_code == 200 and fresh.json()["refresh_token"] != old_refresh
    pair = ("access_token", "refresh_token")
    assert again.status_code == 200
    assert [again.json()[k] for k in pair] == [fresh.json()[k] for k in pair]
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    assert following.status_code == 400  # the late replay ended the grant
    assert any(r.get("action") == "refresh" for r in records)
    admin = (tmp_path / "audit-admin.log").read_text()
    assert '"grant"' in admin and '"refresh"' not in admin
