"""Remote access without silent failures (issue 42): the host of ``[host] remote_url`` is let in
by itself, and a refused Host or Origin is logged, at a bounded rate, with the setting that
would let it in."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx2
import pytest

from tests.conftest import bound, gateway
from tests.oauth_helpers import HOST_TOKEN

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

REMOTE = "https://devices.example.com"
ASKS = 20


def refusals(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    said = [record.getMessage() for record in caplog.records]
    return [line for line in said if line.startswith(f"refused a {what}")]


async def test_the_remote_url_s_host_passes_and_an_unknown_one_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``[host] remote_url`` alone (no allowed_hosts), the listener on loopback as behind a
    tunnel on this machine: requests naming its host pass; ``ASKS`` requests naming another
    are each refused (421) and logged once, naming the setting that would allow it."""
    caplog.set_level(logging.WARNING, "gateway.host_side.http")
    async with (
        gateway(tmp_path, host_token=HOST_TOKEN, host_public_url=REMOTE) as run,
        httpx2.AsyncClient(base_url=f"http://127.0.0.1:{run.host_port}", timeout=bound(10)) as http,
    ):
        metadata = "/.well-known/oauth-protected-resource/mcp"
        tunnel = await http.get(metadata, headers={"Host": "devices.example.com"})
        with_port = await http.get(metadata, headers={"Host": "devices.example.com:443"})
        app = await http.get(metadata, headers={"Host": "devices.example.com",
                                                "Origin": REMOTE})  # fmt: skip
        refused = [
            (await http.get(metadata, headers={"Host": "other.example.net"})).status_code
            for _ in range(ASKS)
        ]
        foreign = [
            (await http.get(metadata, headers={"Origin": "https://elsewhere.example"})).status_code
            for _ in range(ASKS)
        ]
    assert (tunnel.status_code, with_port.status_code, app.status_code) == (200, 200, 200)
    assert tunnel.json()["resource"] == f"{REMOTE}/mcp"
    assert refused == [421] * ASKS and foreign == [403] * ASKS
    [host_line] = refusals(caplog, "request for Host")
    assert "'other.example.net'" in host_line and "[host] allowed_hosts" in host_line
    [origin_line] = refusals(caplog, "request from Origin")
    assert "https://elsewhere.example" in origin_line and "allowed_origins" in origin_line
