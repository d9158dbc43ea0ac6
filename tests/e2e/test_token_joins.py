"""The shared device token's caps (issue 30): past them a new device waits for approval."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import httpx2
import pytest
from websockets.asyncio.client import connect

from gateway.app import Running
from gateway.devices.device import APPROVED, PENDING
from tests.conftest import bound, gateway
from tests.e2e.helpers import stock_headers

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def join(run: Running, n: int, token: str | None = None) -> str:
    """A device connects with the shared token (or ``token``); its state once admitted."""
    device_id = f"aa:30:00:00:00:{n:02x}"
    headers = {**stock_headers(device_id), "Client-Id": f"5b3f4c1e-0000-4000-8000-{n:012d}"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    with anyio.fail_after(bound(10)):
        async with connect(run.device_url, additional_headers=headers):
            pass  # accepted: what the login decided is on disk
    device = run.gateway.registry.get(device_id)
    assert device is not None
    return device.record.state


async def test_new_devices_past_the_shared_tokens_caps_wait_for_approval(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Three an hour: the fourth and fifth new devices with the shared token are pending, with
    a log line saying why and how to approve; one already approved is not counted again; a
    per-board token is not capped; approving a waiting device works as for a stock one."""
    caplog.set_level(logging.WARNING, logger="gateway.devices.admin")
    async with gateway(tmp_path, token_joins_per_hour=3, token_joins_total=10) as run:
        states = [await join(run, n) for n in range(5)]
        assert states == [APPROVED] * 3 + [PENDING] * 2
        assert await join(run, 0) == APPROVED  # known: it does not count again
        assert "new device aa:30:00:00:00:03 from 127.0.0.1 presented the shared" in caplog.text
        assert "3 new devices joined with the shared device token in the last hour" in caplog.text
        assert "esp-mcp-gateway devices approve aa:30:00:00:00:03" in caplog.text
        hosts_see = {t.device.device_id for t in run.gateway.registry.exposed_tools()}
        assert not hosts_see & {"aa:30:00:00:00:03", "aa:30:00:00:00:04"}

        base = f"http://127.0.0.1:{run.host_port}"
        async with httpx2.AsyncClient() as http:
            issued = (await http.post(base + "/api/enroll", json={"name": "bench"})).json()
            approved = await http.post(base + "/api/devices/approve",
                                       json={"device": "aa:30:00:00:00:03"})  # fmt: skip
        assert approved.status_code == 200
        assert await join(run, 3) == APPROVED
        assert await join(run, 9, token=issued["token"]) == APPROVED  # a per-board token
        assert run.gateway.registry.admin.token_joins.joined == 3


async def test_the_total_cap_holds_across_hours(tmp_path: Path) -> None:
    """However the joins spread over time, no more than the total are approved by the token."""
    async with gateway(tmp_path, token_joins_per_hour=100, token_joins_total=2) as run:
        joins = run.gateway.registry.admin.token_joins
        states = []
        for n in range(4):
            states.append(await join(run, n))
            joins._recent.clear()  # as if an hour had passed since each join
        assert states == [APPROVED, APPROVED, PENDING, PENDING]
