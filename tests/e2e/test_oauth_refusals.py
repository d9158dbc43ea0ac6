"""What bad input gets from the gateway's OAuth server (issue 27): a clear refusal every time, and
no token without the owner's consent. A real gateway; the owner is headless Chromium."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.app import Running
from gateway.host_side.oauth.client_documents import ClientDocumentError, ClientDocuments
from gateway.net.networks import networks
from tests.conftest import asgi_server, bound
from tests.e2e.helpers import listed_device
from tests.oauth_helpers import (
    ADMIN,
    HOST_TOKEN,
    authorize_url,
    base_url,
    callback_server,
    consent_browser,
    granting,
    http_to,
    https_server,
    manual_grant,
    mcp_with,
    oauth_gateway,
    pkce,
    register,
    self_signed,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

VOLUME = "sim-esp32_0001_audio_speaker_set_volume"


def refused_with_pointer(response: httpx2.Response, run: Running) -> None:
    assert response.status_code == 401, response.text
    pointer = f'resource_metadata="{base_url(run)}/.well-known/oauth-protected-resource/mcp"'
    assert pointer in response.headers["www-authenticate"]


async def connected_apps(http: httpx2.AsyncClient) -> list[str]:
    answer = await http.get("/api/oauth/apps", headers=ADMIN)
    return [app["name"] for app in answer.json()["apps"]]


async def test_missing_or_wrong_pkce_verifier_is_refused(tmp_path: Path) -> None:
    """A code redeemed without its verifier, or with another, gets no token; the right
    verifier still redeems it afterwards."""
    async with granting(tmp_path) as (run, callback, owner, http):
        grant = await manual_grant(http, owner, callback, base_url(run))
        missing = await http.post("/token", data=grant.redeem_form(code_verifier=""))
        wrong = await http.post("/token", data=grant.redeem_form(code_verifier=pkce()[0]))
        right = await http.post("/token", data=grant.redeem_form())
    assert missing.status_code == 400 and missing.json()["error"] == "invalid_request"
    assert wrong.status_code == 400 and wrong.json() == {
        "error": "invalid_grant",
        "error_description": "incorrect code_verifier",
    }
    assert right.status_code == 200 and right.json()["access_token"]


async def test_replayed_code_is_refused_and_revokes_the_first_grant(tmp_path: Path) -> None:
    """The second use of a code is refused, and the token the first use got stops working."""
    async with granting(tmp_path) as (run, callback, owner, http):
        grant = await manual_grant(http, owner, callback, base_url(run))
        first = await http.post("/token", data=grant.redeem_form())
        token = first.json()["access_token"]
        assert (await mcp_with(http, token)).status_code == 200
        replay = await http.post("/token", data=grant.redeem_form())
        after = await mcp_with(http, token)
        refresh = await http.post(
            "/token",
            data={
                "grant_type": "refresh_token",
                "refresh_token": first.json()["refresh_token"],
                "client_id": grant.client_id,
            },
        )
        assert await connected_apps(http) == []
        refused_with_pointer(after, run)
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    assert refresh.status_code == 400


async def test_app_revokes_its_token_rfc7009(tmp_path: Path) -> None:
    """An app that gives its refresh token up (RFC 7009) ends the grant: its access token is
    a 401 from then on, and the app leaves Connected apps."""
    async with granting(tmp_path) as (run, callback, owner, http):
        grant = await manual_grant(http, owner, callback, base_url(run))
        tokens = (await http.post("/token", data=grant.redeem_form())).json()
        assert await connected_apps(http) == ["Manual app"]
        revoked = await http.post(
            "/revoke",
            # client_secret: the SDK's revocation handler wants the field, even empty
            data={
                "token": tokens["refresh_token"],
                "client_id": grant.client_id,
                "client_secret": "",
            },
        )
        refused_with_pointer(await mcp_with(http, tokens["access_token"]), run)
        assert await connected_apps(http) == []
    assert revoked.status_code == 200


async def test_tokens_go_out_over_plain_http_only_on_loopback_and_listed_networks(
    tmp_path: Path,
) -> None:
    """A LAN client (as a proxy on this machine reports it) asking for a token over plain HTTP
    is refused with the reason; over HTTPS, or from a listed network, it is served. The consent
    page works over plain HTTP from the LAN, as the dashboard does."""
    lan = {"X-Forwarded-For": "192.168.1.20"}
    form = {
        "grant_type": "authorization_code",
        "code": "x",
        "client_id": "nobody",
        "code_verifier": "v" * 43,
    }
    async with oauth_gateway(tmp_path) as run, http_to(run) as http:
        plain = await http.post("/token", data=form, headers=lan)
        register_plain = await http.post("/register", json={}, headers=lan)
        https = await http.post("/token", data=form, headers={**lan, "X-Forwarded-Proto": "https"})
        metadata = await http.get("/.well-known/oauth-authorization-server", headers=lan)
    async with oauth_gateway(tmp_path / "listed", oauth_http_networks=("192.168.1.0/24",)) as run:
        async with http_to(run) as http:
            listed = await http.post("/token", data=form, headers=lan)
    assert plain.status_code == 403 and "HTTPS" in plain.json()["error_description"]
    assert register_plain.status_code == 403
    assert https.status_code == 401  # past the rule: an unknown client
    assert listed.status_code == 401
    assert metadata.status_code == 200


async def test_bad_redirect_uris_and_open_redirect_tricks_are_refused(tmp_path: Path) -> None:
    """Registration refuses redirect URIs that are not https or loopback, or that carry a
    fragment; /authorize refuses any redirect URI but the registered one (a loopback one with
    any port, RFC 8252 §7.3, but never another host or path), answering the browser itself
    (400), never redirecting to the unregistered place."""
    async with oauth_gateway(tmp_path) as run, http_to(run) as http:
        bad = {}
        for uri in (
            "http://evil.example/cb",
            "javascript:alert(1)",
            "https://app.example/cb#x",
            "data:text/html,hi",
        ):
            answer = await http.post(
                "/register",
                json={
                    "client_name": "x",
                    "redirect_uris": [uri],
                    "token_endpoint_auth_method": "none",
                },
            )
            bad[uri] = answer
        client = await register(http, "http://127.0.0.1:9/callback")
        _, challenge = pkce()
        tricks = [
            "https://evil.example/callback",
            "http://127.0.0.1:9/callback/../../evil",
            "http://127.0.0.1:9/callback?next=https://evil.example",
            "http://127.0.0.1:9@evil.example/callback",
            "http://localhost:9/callback",
            "http://127.0.0.1:99/callback2",
        ]
        answers = [
            await http.get(authorize_url(base_url(run), client["client_id"], uri, challenge))
            for uri in tricks
        ]
    for uri, answer in bad.items():
        assert answer.status_code == 400, uri
        assert answer.json()["error"] in ("invalid_redirect_uri", "invalid_client_metadata"), uri
    for uri, answer in zip(tricks, answers, strict=True):
        assert answer.status_code == 400, uri  # no redirect at all
        assert "location" not in answer.headers
        assert "not registered" in answer.json()["error_description"], uri


async def test_resource_of_another_server_is_refused(tmp_path: Path) -> None:
    """RFC 8707: an authorization request for another resource is answered invalid_target."""
    async with oauth_gateway(tmp_path) as run, http_to(run) as http:
        client = await register(http, "http://127.0.0.1:9/callback")
        url = authorize_url(
            base_url(run),
            client["client_id"],
            "http://127.0.0.1:9/callback",
            pkce()[1],
            resource="https://other.example/mcp",
        )
        answer = await http.get(url)
    assert answer.status_code == 302
    assert answer.headers["location"].startswith("http://127.0.0.1:9/callback?error=invalid_target")


async def test_expired_forged_and_wrong_audience_tokens_get_401_with_pointer(
    tmp_path: Path,
) -> None:
    """An expired token, a made-up one, and one issued for another resource (this gateway as
    http://localhost:<port>, presented at http://127.0.0.1:<port>) are all 401s that point at
    the resource metadata; the host token still works beside them."""
    async with granting(tmp_path, oauth_access_token_lifetime=0.001) as (
        run,
        callback,
        owner,
        http,
    ):
        grant = await manual_grant(http, owner, callback, base_url(run))
        expired = (await http.post("/token", data=grant.redeem_form())).json()["access_token"]
        forged = "gwa_" + "A" * 43
        host_token = await mcp_with(http, HOST_TOKEN)
        answers = [await mcp_with(http, token) for token in (expired, forged)]
    async with (
        oauth_gateway(tmp_path / "second") as run,
        callback_server() as callback,
        consent_browser() as owner,
    ):
        elsewhere = f"http://localhost:{run.host_port}"
        async with http_to(run, host=f"localhost:{run.host_port}") as local:
            grant = await manual_grant(local, owner, callback, elsewhere)
            issued = await local.post("/token", data=grant.redeem_form())
            accepted_there = await mcp_with(local, issued.json()["access_token"])
        async with http_to(run) as http:
            wrong_audience = await mcp_with(http, issued.json()["access_token"])
            refused_with_pointer(wrong_audience, run)
    assert host_token.status_code == 200
    assert accepted_there.status_code == 200
    for answer in answers:
        assert answer.status_code == 401
        assert "resource_metadata=" in answer.headers["www-authenticate"]


async def test_app_tokens_never_open_the_dashboard_or_admin_api(tmp_path: Path) -> None:
    """An app's token works on /mcp only: the JSON API (admin actions, user-only calls) and
    the Connected apps list refuse it."""
    async with granting(tmp_path) as (run, callback, owner, http):
        grant = await manual_grant(http, owner, callback, base_url(run))
        token = (await http.post("/token", data=grant.redeem_form())).json()["access_token"]
        app = {"Authorization": f"Bearer {token}"}
        answers = [
            await http.get("/api/devices", headers=app),
            await http.post("/api/devices/pair", headers=app, json={"seconds": 60}),
            await http.post("/api/call", headers=app, json={"device": "x", "tool": "reboot"}),
            await http.get("/api/oauth/apps", headers=app),
        ]
    assert [answer.status_code for answer in answers] == [401, 401, 401, 401]


async def test_app_allowed_to_list_only_cannot_call_tools(tmp_path: Path) -> None:
    """An app the owner let list devices (scope devices.list) sees the tools, and a call gets
    a clear isError, never reaching the device."""
    async with (
        oauth_gateway(tmp_path) as run,
        listed_device(run, "02:00:00:00:00:01") as dev,
        callback_server() as callback,
        consent_browser() as owner,
        http_to(run) as http,
    ):
        grant = await manual_grant(http, owner, callback, base_url(run), scope="devices.list")
        token = (await http.post("/token", data=grant.redeem_form())).json()["access_token"]
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=bound(10)) as app_http:
            async with Client(streamable_http_client(run.mcp_url, http_client=app_http)) as client:
                listed = [tool.name for tool in (await client.list_tools()).tools]
                result = await client.call_tool(VOLUME, {"volume": 3})
    assert VOLUME in listed
    assert result.is_error and "tools.call" in result.content[0].text  # type: ignore[union-attr]
    assert dev.calls == []


async def test_registration_flood_is_rate_limited_and_capped(tmp_path: Path) -> None:
    """Registrations from one address past the rate get 429; once allowed apps alone fill the
    cap on apps, 400 with what to do; nothing is registered by a refused request."""
    async with oauth_gateway(tmp_path, oauth_registrations_per_minute=3.0) as run:
        async with http_to(run) as http:
            body = {"client_name": "flood", "redirect_uris": ["http://127.0.0.1:9/cb"]}
            statuses = [(await http.post("/register", json=body)).status_code for _ in range(5)]
    assert statuses == [201, 201, 201, 429, 429]
    async with granting(tmp_path / "cap", oauth_max_clients=1) as (run, callback, owner, http):
        await manual_grant(http, owner, callback, base_url(run))
        refused = await http.post("/register", json=body)
    assert refused.status_code == 400
    assert "limit" in refused.json()["error_description"]
    assert "Connected apps" in refused.json()["error_description"]


async def test_consent_form_csrf_and_cross_site_posts_are_refused(tmp_path: Path) -> None:
    """The consent form's answer needs the page's CSRF value and its SameSite cookie; a post
    from another site is refused by the Origin check; none of them grants anything."""
    async with (
        oauth_gateway(tmp_path) as run,
        http_to(run) as http,
    ):
        client = await register(http, "http://127.0.0.1:9/callback")
        url = authorize_url(
            base_url(run), client["client_id"], "http://127.0.0.1:9/callback", pkce()[1]
        )
        consent = await http.get(url)
        request_id = consent.headers["location"].split("request=")[1]
        page = await http.get(f"/consent?request={request_id}")
        csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
        form = {"request": request_id, "csrf": csrf, "decision": "allow", "token": HOST_TOKEN}
        wrong = await http.post("/consent", data={**form, "csrf": "guess"})
        cross_site = await http.post(
            "/consent", data=form, headers={"Origin": "https://evil.example"}
        )
        http.cookies.clear()
        no_cookie = await http.post("/consent", data=form)
        assert await connected_apps(http) == []
    assert no_cookie.status_code == 403 and "CSRF" in no_cookie.text
    assert wrong.status_code == 403
    assert cross_site.status_code == 403 and "Invalid Origin" in cross_site.text


async def test_consent_page_cannot_be_framed(tmp_path: Path) -> None:
    """The consent page says so in its headers, and Chromium shows nothing of it inside a
    frame on another site's page."""

    async def framing(request: Request) -> Response:
        return HTMLResponse(f'<iframe id="f" src="{request.query_params["src"]}"></iframe>')

    async with (
        oauth_gateway(tmp_path) as run,
        http_to(run) as http,
        asgi_server(Starlette(routes=[Route("/", framing)]), "framer") as framer,
        consent_browser() as owner,
    ):
        client = await register(http, "http://127.0.0.1:9/callback")
        url = authorize_url(
            base_url(run), client["client_id"], "http://127.0.0.1:9/callback", pkce()[1]
        )
        consent_url = base_url(run) + "/" + (await http.get(url)).headers["location"]
        shown = await http.get(consent_url)
        page = await owner.open(f"{framer}/?src={consent_url}")
        frame = await (await page.wait_for_selector("#f")).content_frame()
        assert frame is not None
        framed_allow = await frame.query_selector("#allow")
    assert shown.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in shown.headers["content-security-policy"]
    assert framed_allow is None


async def test_wrong_host_token_on_the_consent_page_grants_nothing(tmp_path: Path) -> None:
    """A wrong host token in the page's password field is refused (the page says so); the
    request can still be answered with the right one."""
    async with granting(tmp_path) as (run, callback, owner, http):
        client = await register(http, callback.url)
        url = authorize_url(base_url(run), client["client_id"], callback.url, pkce()[1])
        owner.token = "not-the-host-token"
        with pytest.raises(AssertionError, match="not this gateway's host token"):
            await owner.consent(url)
        page = owner.pages[-1]
        assert await connected_apps(http) == [] and callback.received == []
        await page.fill('input[name="token"]', HOST_TOKEN)
        async with page.expect_navigation():
            await page.click("#allow")
        assert "code" in await callback.next()


async def test_owner_denies_and_no_token_is_issued(tmp_path: Path) -> None:
    """Deny sends the browser back with access_denied (and iss, state); no app is connected."""
    async with granting(tmp_path) as (run, callback, owner, http):
        owner.decision = "deny"
        client = await register(http, callback.url)
        await owner.consent(
            authorize_url(base_url(run), client["client_id"], callback.url, pkce()[1])
        )
        query = await callback.next()
        assert await connected_apps(http) == []
    assert query["error"] == "access_denied" and query["state"] == "st4te"
    assert query["iss"] == base_url(run) and "code" not in query


# --- hostile client metadata documents ----------------------------------------------------------


def hostile_documents(base: list[str]) -> Starlette:
    """Documents that go wrong in every way a hostile app could make them."""

    async def huge(request: Request) -> Response:
        return JSONResponse({"client_id": f"{base[0]}/huge.json", "pad": "x" * 100_000})

    async def loop(request: Request) -> Response:
        return RedirectResponse(f"{base[0]}/loop.json?{time.monotonic_ns()}", 302)

    async def mismatch(request: Request) -> Response:
        return JSONResponse(
            {
                "client_id": "https://someone-else.example/app.json",
                "redirect_uris": ["http://127.0.0.1:9/cb"],
            }
        )

    async def script(request: Request) -> Response:
        return JSONResponse(
            {"client_id": f"{base[0]}/script.json", "redirect_uris": ["javascript:alert(1)"]}
        )

    async def slow(request: Request) -> Response:
        await anyio.sleep_forever()
        raise AssertionError

    return Starlette(
        routes=[
            Route("/huge.json", huge),
            Route("/loop.json", loop),
            Route("/mismatch.json", mismatch),
            Route("/slow.json", slow),
            Route("/script.json", script),
        ]
    )


async def test_hostile_client_metadata_documents_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Huge, endlessly redirecting and mismatching documents, and private or loopback
    addresses the owner did not list, are refused at /authorize with the reason."""
    cert, key = self_signed(tmp_path / "tls")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    base: list[str] = []
    async with https_server(hostile_documents(base), cert, key) as served:
        base.append(served)
        answers = {}
        async with oauth_gateway(tmp_path / "a", oauth_metadata_networks=("127.0.0.0/8",)) as run:
            async with http_to(run) as http:
                for name in ("huge", "loop", "mismatch", "script"):
                    url = authorize_url(
                        base_url(run), f"{served}/{name}.json", "http://127.0.0.1:9/cb", pkce()[1]
                    )
                    answers[name] = await http.get(url)
        async with oauth_gateway(tmp_path / "b") as run:  # loopback not listed
            async with http_to(run) as http:
                for name, client_id in (
                    ("loopback", f"{served}/mismatch.json"),
                    ("private", "https://10.1.2.3/app.json"),
                    ("link-local", "https://169.254.169.254/app.json"),
                    ("plain http", "http://app.example/app.json"),
                ):
                    url = authorize_url(
                        base_url(run), client_id, "http://127.0.0.1:9/cb", pkce()[1]
                    )
                    answers[name] = await http.get(url)
        documents = ClientDocuments(networks(("127.0.0.0/8",)), timeout=bound(0.5))
        with pytest.raises(ClientDocumentError, match="did not answer"):
            await documents.get(f"{served}/slow.json")
    why = {name: answer.json().get("error_description", "") for name, answer in answers.items()}
    assert all(answer.status_code == 400 for answer in answers.values()), why
    assert "larger than" in why["huge"]
    assert "redirects" in why["loop"]
    assert "is not its own URL" in why["mismatch"]
    assert "cannot be a redirect URI" in why["script"]
    assert "this machine" in why["loopback"]
    assert "private address" in why["private"]
    assert "link-local" in why["link-local"]
    assert "not found" in why["plain http"]  # not a document id: an unknown registered client
