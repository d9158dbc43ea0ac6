"""The smaller OAuth items of issue 41, each as an app or the owner meets it: public clients may
revoke (and the metadata says so), a request without credentials gets a 401 without an error
code, a consent never redeemed is no connected app, a revoke during a tool call answers that
call, a refused request on the way to consent is a page, and the consent cookies are ``Secure``
behind a trusted HTTPS proxy. A real gateway; the owner is headless Chromium."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from gateway.simulator.simtool import SimTool
from tests.conftest import bound
from tests.e2e.helpers import listed_device
from tests.oauth_helpers import (
    ADMIN,
    HOST_TOKEN,
    STREAM,
    authorize_url,
    base_url,
    granting,
    http_to,
    manual_grant,
    oauth_gateway,
    pkce,
    register,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM = "02:00:00:00:00:01"
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


async def connected_apps(http: httpx2.AsyncClient) -> list[str]:
    answer = await http.get("/api/oauth/apps", headers=ADMIN)
    return [app["name"] for app in answer.json()["apps"]]


async def test_metadata_lets_public_clients_revoke(tmp_path: Path) -> None:
    """The metadata lists ``none`` among the revocation endpoint's methods, and a public
    client revokes with its client_id alone (RFC 7009 §2.1, no client_secret field at all)."""
    async with granting(tmp_path) as (run, callback, owner, http):
        metadata = (await http.get("/.well-known/oauth-authorization-server")).json()
        grant = await manual_grant(http, owner, callback, base_url(run))
        tokens = (await http.post("/token", data=grant.redeem_form())).json()
        revoked = await http.post(
            "/revoke", data={"token": tokens["refresh_token"], "client_id": grant.client_id}
        )
        apps = await connected_apps(http)
    assert "none" in metadata["revocation_endpoint_auth_methods_supported"]
    assert revoked.status_code == 200
    assert apps == []


async def test_401_without_credentials_carries_no_error_code(tmp_path: Path) -> None:
    """RFC 6750 §3.1: a request with no credentials gets the challenge and the metadata
    pointer, no ``error``; one with a bad token gets ``error="invalid_token"``."""
    async with oauth_gateway(tmp_path) as run, http_to(run, **STREAM) as http:
        bare = await http.post("/mcp", json=TOOLS_LIST)
        bad = await http.post("/mcp", json=TOOLS_LIST, headers={"Authorization": "Bearer gwa_x"})
    pointer = f'resource_metadata="{base_url(run)}/.well-known/oauth-protected-resource/mcp"'
    assert bare.status_code == 401 and bad.status_code == 401
    assert bare.headers["www-authenticate"] == f"Bearer {pointer}"
    assert "error" not in bare.json()
    assert (
        'error="invalid_token"' in bad.headers["www-authenticate"]
        and pointer in (bad.headers["www-authenticate"])
    )


async def test_a_consent_never_redeemed_is_not_a_connected_app(tmp_path: Path) -> None:
    """The owner allowed an app that never came back for its tokens: Connected apps does not
    list it; once the app redeems the code, it does."""
    async with granting(tmp_path) as (run, callback, owner, http):
        grant = await manual_grant(http, owner, callback, base_url(run))
        before = await connected_apps(http)
        assert (await http.post("/token", data=grant.redeem_form())).status_code == 200
        after = await connected_apps(http)
    assert before == []
    assert after == ["Manual app"]


async def test_revoking_an_app_during_its_tool_call_answers_the_call(tmp_path: Path) -> None:
    """The owner revokes an app while its tool call waits on the device: the MCP SDK client's
    call gets a JSON-RPC error saying so (not an empty answer it would wait on)."""
    reached = anyio.Event()

    async def slow(arguments: object) -> str:
        reached.set()
        await anyio.sleep_forever()
        raise AssertionError

    tools = [SimTool("self.slow", "A tool that takes its time.", {}, slow)]
    async with (
        granting(tmp_path) as (run, callback, owner, http),
        listed_device(run, SIM, tools=tools),
    ):
        grant = await manual_grant(http, owner, callback, base_url(run))
        tokens = (await http.post("/token", data=grant.redeem_form())).json()
        headers = {"Authorization": f"Bearer {tokens['access_token']}"}
        failure: list[BaseException] = []

        async def call(client: Client) -> None:
            try:
                await client.call_tool("sim-esp32_0001_slow", {})
            except MCPError as exc:
                failure.append(exc)

        async with httpx2.AsyncClient(headers=headers, timeout=bound(10)) as app_http:
            async with Client(streamable_http_client(run.mcp_url, http_client=app_http)) as client:
                with anyio.fail_after(bound(10)):
                    async with anyio.create_task_group() as calls:
                        calls.start_soon(call, client)
                        await reached.wait()
                        revoked = await http.post(
                            "/api/oauth/revoke", json={"client_id": grant.client_id}, headers=ADMIN
                        )
                        assert revoked.status_code == 200
    assert len(failure) == 1
    assert "revoked" in str(failure[0])


async def test_a_refusal_on_the_way_to_consent_is_a_page(tmp_path: Path) -> None:
    """The owner's browser, sent to /authorize for a client metadata document the gateway
    refuses (a private address) or an app it does not know, gets a page in the dashboard's
    look with the reason, not JSON; an app's own HTTP client still gets JSON."""
    async with granting(tmp_path) as (run, callback, owner, http):
        reasons = {}
        for name, client_id in (("document", "https://10.1.2.3/app.json"), ("unknown", "nobody")):
            url = authorize_url(base_url(run), client_id, callback.url, pkce()[1])
            page = await owner.open(url)
            assert await page.title() == "Allow an app · esp-mcp-gateway"
            sheet = await page.evaluate("document.styleSheets[0].cssRules.length")
            assert sheet > 0  # the dashboard's stylesheet, loaded
            reasons[name] = await page.inner_text("#reason")
        json_answer = await http.get(
            authorize_url(base_url(run), "nobody", callback.url, pkce()[1])
        )
    assert "private address" in reasons["document"]
    assert "nobody" in reasons["unknown"]
    assert json_answer.status_code == 400 and json_answer.json()["error"]


async def test_consent_cookies_are_secure_behind_a_trusted_https_proxy(tmp_path: Path) -> None:
    """A TLS proxy the owner listed in ``[host] trusted_proxies`` (here 127.0.0.2, which
    uvicorn's own proxy-header rule does not trust) says the browser came over HTTPS: the
    consent page's cookie is ``Secure``; over plain HTTP it is not, so the browser keeps it."""
    proxy = httpx2.AsyncHTTPTransport(local_address="127.0.0.2")
    async with granting(tmp_path, host_trusted_proxies=("127.0.0.2/32",)) as (
        run,
        callback,
        owner,
        http,
    ):
        client = await register(http, callback.url)
        cookies = {}
        async with httpx2.AsyncClient(
            base_url=base_url(run), transport=proxy, timeout=bound(10)
        ) as via_proxy:
            for scheme in ("https", "http"):
                forwarded = {"X-Forwarded-Proto": scheme, "X-Forwarded-For": "192.168.1.20"}
                url = authorize_url(base_url(run), client["client_id"], callback.url, pkce()[1])
                sent = await via_proxy.get(url, headers=forwarded)
                assert sent.status_code == 302, sent.text
                page = await via_proxy.get(f"/{sent.headers['location']}", headers=forwarded)
                assert page.status_code == 200, page.text
                cookies[scheme] = page.headers["set-cookie"]
    assert "secure" in cookies["https"].lower()
    assert "secure" not in cookies["http"].lower()


async def test_the_dashboard_session_cookie_is_secure_behind_a_trusted_https_proxy(
    tmp_path: Path,
) -> None:
    """The dashboard's sign-in follows the same rule as the consent page: through a TLS proxy
    the owner listed (127.0.0.2, which uvicorn's own proxy-header rule does not trust) that says
    the browser came over HTTPS, the session cookie is ``Secure``; over plain HTTP it is not."""
    proxy = httpx2.AsyncHTTPTransport(local_address="127.0.0.2")
    cookies = {}
    async with (
        oauth_gateway(tmp_path, host_trusted_proxies=("127.0.0.2/32",)) as run,
        httpx2.AsyncClient(base_url=base_url(run), transport=proxy, timeout=bound(10)) as via,
    ):
        for scheme in ("https", "http"):
            forwarded = {"X-Forwarded-Proto": scheme, "X-Forwarded-For": "192.168.1.20"}
            signed_in = await via.post("/login", json={"token": HOST_TOKEN}, headers=forwarded)
            assert signed_in.status_code == 200, signed_in.text
            cookies[scheme] = signed_in.headers["set-cookie"]
    assert "secure" in cookies["https"].lower()
    assert "secure" not in cookies["http"].lower()
