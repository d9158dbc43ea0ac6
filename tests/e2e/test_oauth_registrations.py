"""Registrations nobody allowed cannot lock apps out (issue 41): one address registering more
apps than the gateway's cap keeps only its latest few, apps never allowed are forgotten within
minutes, and an app the owner allowed is never pushed out. A real gateway; the owner is headless
Chromium; the app after the flood is the MCP Python SDK's ``OAuthClientProvider``."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from gateway.host_side.oauth.store import NEW_CLIENT_AGE, UNALLOWED_PER_ADDRESS
from tests.e2e.helpers import listed_device
from tests.oauth_helpers import (
    ADMIN,
    authorize_url,
    base_url,
    granting,
    manual_grant,
    mcp_with,
    pkce,
    sdk_auth,
    sdk_client,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM = "02:00:00:00:00:01"
VOLUME = "sim-esp32_0001_audio_speaker_set_volume"
CAP = 12
# One Internet address behind a tunnel, as the trusted proxy (on loopback here) reports it.
FLOOD = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}


async def known(
    http: httpx2.AsyncClient, run_base: str, client_id: str, redirect: str = "http://127.0.0.1:9/cb"
) -> bool:
    """Whether /authorize still knows the registered app ``client_id``."""
    url = authorize_url(run_base, client_id, redirect, pkce()[1])
    answer = await http.get(url)
    assert answer.status_code in (302, 400), answer.text
    return answer.status_code == 302


async def test_a_registration_flood_from_one_address_locks_no_app_out(tmp_path: Path) -> None:
    """More registrations from one address than the cap on apps: each is answered, and that
    address keeps only its latest few; the app allowed before the flood still works and
    refreshes; an app registering from another address afterwards signs in with the owner's
    consent and calls a tool; minutes later the flood's apps are forgotten, the allowed one
    is not."""
    async with (
        granting(tmp_path, oauth_max_clients=CAP, oauth_registrations_per_minute=1000.0) as (
            run,
            callback,
            owner,
            http,
        ),
        listed_device(run, SIM),
    ):
        base = base_url(run)
        allowed = await manual_grant(http, owner, callback, base)
        tokens = (await http.post("/token", data=allowed.redeem_form())).json()
        body = {"client_name": "flood", "redirect_uris": ["http://127.0.0.1:9/cb"]}
        flood = [await http.post("/register", json=body, headers=FLOOD) for _ in range(3 * CAP)]
        assert [answer.status_code for answer in flood] == [201] * (3 * CAP)
        ids = [answer.json()["client_id"] for answer in flood]
        kept = [await known(http, base, client_id) for client_id in ids]
        assert kept == [False] * (3 * CAP - UNALLOWED_PER_ADDRESS) + [True] * UNALLOWED_PER_ADDRESS

        assert (await mcp_with(http, tokens["access_token"])).status_code == 200
        refresh = {
            "grant_type": "refresh_token",
            "client_id": allowed.client_id,
            "refresh_token": tokens["refresh_token"],
        }
        assert (await http.post("/token", data=refresh)).status_code == 200

        auth = sdk_auth(run, owner, callback, name="After the flood")
        async with sdk_client(run, auth) as client:
            result = await client.call_tool(VOLUME, {"volume": 5})
        assert not result.is_error

        store = run.gateway.oauth.store  # type: ignore[union-attr]
        clock = store.clock
        store.clock = lambda: clock() + NEW_CLIENT_AGE + 1
        late = await http.post("/register", json=body)  # registering is when apps are forgotten
        assert late.status_code == 201
        flood_left = [await known(http, base, client_id) for client_id in ids[-3:]]
        allowed_left = await known(http, base, allowed.client_id, allowed.redirect)
        apps = (await http.get("/api/oauth/apps", headers=ADMIN)).json()["apps"]
    assert flood_left == [False, False, False]
    assert allowed_left
    assert sorted(app["name"] for app in apps) == ["After the flood", "Manual app"]
