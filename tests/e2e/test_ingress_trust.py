"""Home Assistant's ingress: the dashboard trusts the Supervisor's proxy (and nobody else)
without the host token, as HA documents; the MCP routes never trust it (issue 27)."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from tests.conftest import bound, gateway
from tests.e2e.ingress import ingress
from tests.oauth_helpers import HOST_TOKEN, consent_browser

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SUPERVISOR = "127.0.0.2"  # plays 172.30.32.2: another loopback address than the browser's
PREFIX = "/api/hassio_ingress/abc123"


async def test_dashboard_under_ingress_needs_no_host_token_but_direct_access_does(
    tmp_path: Path,
) -> None:
    """Through the ingress peer the dashboard opens and its API answers without sign-in; the
    same browser reaching the gateway directly is sent to sign in; /mcp stays closed to the
    peer's requests without a token."""
    async with (
        gateway(tmp_path, host_token=HOST_TOKEN, host_ingress_peers=(SUPERVISOR,)) as run,
        ingress(f"http://127.0.0.1:{run.host_port}", PREFIX, source=SUPERVISOR) as proxy,
        consent_browser() as owner,
    ):
        page = await owner.open(proxy + PREFIX + "/")
        await page.wait_for_selector("#live.on")
        assert page.url == proxy + PREFIX + "/"
        assert await page.locator("#logout").is_hidden()
        direct = await owner.open(f"http://127.0.0.1:{run.host_port}/")
        await direct.wait_for_url("**/login")
        async with httpx2.AsyncClient(base_url=proxy + PREFIX, timeout=bound(10)) as http:
            devices = await http.get("/api/dashboard/devices")
            mcp = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert devices.status_code == 200
    assert mcp.status_code == 401


async def test_an_address_in_x_forwarded_for_is_never_taken_for_the_ingress_peer(
    tmp_path: Path,
) -> None:
    """A local process naming the ingress peer in X-Forwarded-For (which uvicorn believes from
    127.0.0.1) is refused on the dashboard, its API and /mcp; the peer itself still passes."""
    forged = {"X-Forwarded-For": SUPERVISOR}
    rename = {"device_id": "esp32-x", "name": "forged"}
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    async with gateway(tmp_path, host_token=HOST_TOKEN, host_ingress_peers=(SUPERVISOR,)) as run:
        base = f"http://127.0.0.1:{run.host_port}"
        async with httpx2.AsyncClient(base_url=base, timeout=bound(10), headers=forged) as http:
            page = await http.get("/")
            devices = await http.get("/api/dashboard/devices")
            renamed = await http.post("/api/devices/rename", json=rename)
            mcp = await http.post("/mcp", json=ping)
        supervisor = httpx2.AsyncHTTPTransport(local_address=SUPERVISOR)
        async with httpx2.AsyncClient(
            base_url=base, timeout=bound(10), transport=supervisor
        ) as peer:
            peer_devices = await peer.get("/api/dashboard/devices")
    assert page.status_code == 303 and page.headers["location"] == "login"
    assert devices.status_code == 401 and "devices" not in devices.json()
    assert renamed.status_code == 401
    assert mcp.status_code == 401
    assert peer_devices.status_code == 200 and peer_devices.json()["devices"] == []
