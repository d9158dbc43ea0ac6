"""``/healthz`` on both listeners answers anyone, so it says only that the gateway is alive."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from tests.conftest import gateway
from tests.e2e.helpers import listed_device

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ALIVE = {"status": "ok"}


async def test_healthz_shows_the_device_count_only_to_the_host_token(tmp_path: Path) -> None:
    """Without the host token (none, a wrong one) it is alive and nothing more; with it, the
    count of devices online; the device listener never says more than alive."""
    async with gateway(tmp_path, host_token="host-secret") as run, listed_device(run):
        host = f"http://127.0.0.1:{run.host_port}/healthz"
        async with httpx2.AsyncClient() as http:
            anyone = await http.get(host)
            wrong = await http.get(host, headers={"Authorization": "Bearer nope"})
            holder = await http.get(host, headers={"Authorization": "Bearer host-secret"})
            device = await http.get(
                f"http://127.0.0.1:{run.device_port}/healthz",
                headers={"Authorization": "Bearer host-secret"},
            )
    assert [r.status_code for r in (anyone, wrong, holder, device)] == [200] * 4
    assert anyone.json() == wrong.json() == device.json() == ALIVE
    assert holder.json() == {**ALIVE, "devices_online": 1}


async def test_healthz_without_a_host_token_configured_says_only_alive(tmp_path: Path) -> None:
    """A loopback gateway without a host token has no token to show the count to."""
    async with gateway(tmp_path) as run, listed_device(run):
        async with httpx2.AsyncClient() as http:
            answers = [
                (await http.get(f"http://127.0.0.1:{port}/healthz")).json()
                for port in (run.host_port, run.device_port)
            ]
    assert answers == [ALIVE, ALIVE]
