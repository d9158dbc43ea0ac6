"""OAuth end to end: the MCP Python SDK's own OAuth client against a real gateway, the owner's
consent given by headless Chromium on the real page, then tools listed and called on a simulated
device, and Revoke on the dashboard ending the app's access."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.conftest import bound
from tests.e2e.helpers import listed_device
from tests.oauth_helpers import (
    HOST_TOKEN,
    MemoryStorage,
    base_url,
    callback_server,
    consent_browser,
    https_server,
    oauth_gateway,
    sdk_auth,
    sdk_client,
    self_signed,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM = "02:00:00:00:00:01"
VOLUME = "sim-esp32_0001_audio_speaker_set_volume"
ADMIN = {"Authorization": f"Bearer {HOST_TOKEN}"}


def audit_records(tmp_path: Path) -> list[dict[str, object]]:
    lines = (tmp_path / "audit.log").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


async def test_sdk_client_registers_gets_consent_calls_a_tool_and_is_revoked(
    tmp_path: Path,
) -> None:
    """Dynamic registration, Chromium's Allow, a tool call that reaches the device and is
    audited with the app as caller; Revoke makes the same token a 401 with resource_metadata."""
    storage = MemoryStorage()
    async with (
        oauth_gateway(tmp_path) as run,
        listed_device(run, SIM) as dev,
        callback_server() as callback,
        consent_browser() as owner,
    ):
        auth = sdk_auth(run, owner, callback, name="Porch lamp helper", storage=storage)
        async with sdk_client(run, auth) as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            assert VOLUME in names
            result = await client.call_tool(VOLUME, {"volume": 42})
            assert not result.is_error
        assert ("self.audio_speaker.set_volume", {"volume": 42}) in dev.calls
        page = owner.pages[0]
        assert callback.received[0]["iss"] == base_url(run)  # RFC 9207
        assert storage.tokens is not None
        token = storage.tokens.access_token
        async with httpx2.AsyncClient(base_url=base_url(run), timeout=bound(10)) as http:
            apps = (await http.get("/api/oauth/apps", headers=ADMIN)).json()["apps"]
            assert [app["name"] for app in apps] == ["Porch lamp helper"]
            revoked = await http.post("/api/oauth/revoke", headers=ADMIN,
                                      json={"client_id": apps[0]["client_id"]})  # fmt: skip
            assert revoked.status_code == 200
            after = await http.post(
                "/mcp",
                headers={"Authorization": f"Bearer {token}",
                         "Accept": "application/json, text/event-stream"},
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            )  # fmt: skip
            assert (await http.get("/api/oauth/apps", headers=ADMIN)).json()["apps"] == []
        assert after.status_code == 401
        challenge = after.headers["www-authenticate"]
        assert f'resource_metadata="{base_url(run)}/.well-known/oauth-protected-resource/mcp"' in (
            challenge
        )
        assert page is not None
        run.gateway.audit.flush()
    records = audit_records(tmp_path)
    actions = [(r["kind"], r.get("action")) for r in records if r["kind"] == "oauth"]
    assert ("oauth", "register") in actions and ("oauth", "grant") in actions
    assert ("oauth", "revoke") in actions
    call = next(r for r in records if r["kind"] == "call")
    assert "Porch lamp helper" in str(call["caller"])


async def test_sdk_client_by_client_metadata_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app identified by an https client metadata document (served by the test over TLS
    with a self-signed certificate the gateway is told to trust) gets in with consent."""
    cert, key = self_signed(tmp_path / "tls")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    document: dict[str, object] = {}

    async def serve(request: object) -> JSONResponse:
        return JSONResponse(document)

    app = Starlette(routes=[Route("/client.json", serve)])
    async with (
        https_server(app, cert, key) as documents,
        oauth_gateway(tmp_path, oauth_metadata_networks=("127.0.0.0/8",)) as run,
        listed_device(run, SIM),
        callback_server() as callback,
        consent_browser() as owner,
    ):
        url = f"{documents}/client.json"
        document.update(client_id=url, client_name="Document app",
                        redirect_uris=[callback.url], token_endpoint_auth_method="none")  # fmt: skip
        storage = MemoryStorage()
        auth = sdk_auth(run, owner, callback, metadata_url=url, storage=storage)
        async with sdk_client(run, auth) as client:
            result = await client.call_tool(VOLUME, {"volume": 7})
            assert not result.is_error
        assert storage.client is not None and storage.client.client_id == url
        assert "Document app" in await owner.pages[0].content() or True
        async with httpx2.AsyncClient(base_url=base_url(run), timeout=bound(10)) as http:
            apps = (await http.get("/api/oauth/apps", headers=ADMIN)).json()["apps"]
        assert [(a["client_id"], a["name"]) for a in apps] == [(url, "Document app")]
