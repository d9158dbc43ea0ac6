"""An audit flood (issue 30): refused logins from thousands of source addresses, on a real
gateway, leave every admin record readable through the API and write a bounded trickle."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import anyio
import httpx2
import pytest

from gateway.app import Running
from gateway.devices.logins import HELD_BACK
from tests.conftest import bound, gateway

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ADDRESSES = 2000  # 127.77.x.y: loopback, each its own source address


async def refused_login(run: Running, n: int) -> bytes:
    """A WebSocket upgrade with a wrong token from 127.77.<n>; the gateway's status line."""
    source = f"127.77.{n // 250}.{n % 250 + 1}"
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", run.device_port, local_addr=(source, 0)
    )
    try:
        writer.write(
            (
                f"GET /xiaozhi/v1/ HTTP/1.1\r\nHost: 127.0.0.1:{run.device_port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                f"Authorization: Bearer not-the-token\r\nDevice-Id: aa:77:00:00:{n // 256:02x}:"
                f"{n % 256:02x}\r\nClient-Id: 5b3f4c1e-0000-4000-8000-{n:012d}\r\n\r\n"
            ).encode()
        )
        return await reader.readline()
    finally:
        writer.close()


async def test_a_flood_from_thousands_of_addresses_leaves_every_admin_record_readable(
    tmp_path: Path,
) -> None:
    """A pairing window is opened (an admin record), then 2,000 refused logins come from 2,000
    addresses: at most a minute's cap of login records is written, the rest are counted, and
    ``/api/audit?kind=admin`` still finds the pairing."""
    async with gateway(tmp_path, audit_logins_per_minute=60) as run:
        base = f"http://127.0.0.1:{run.host_port}"
        async with httpx2.AsyncClient() as http:
            paired = await http.post(base + "/api/devices/pair", json={"seconds": 1})
            assert paired.status_code == 200
            gate = anyio.Semaphore(32)

            async def one(n: int) -> None:
                async with gate:
                    status = await refused_login(run, n)
                assert status.split()[1] in (b"401", b"403"), status

            with anyio.fail_after(bound(120)):
                async with anyio.create_task_group() as group:
                    for n in range(ADDRESSES):
                        group.start_soon(one, n)
            logins = run.gateway.registry.admin.logins
            assert logins.held_back == ADDRESSES - 60
            admin = (await http.get(base + "/api/audit", params={"kind": "admin"})).json()
        assert [r["action"] for r in admin["records"]] == ["pair"]
        logins.end_minute()  # the minute's summary, as when it ends
        run.gateway.audit.flush()
        lines = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
        refused = [r for r in lines if r["kind"] == "login" and r["action"] != HELD_BACK]
        assert len(refused) == 60
        assert len({r["from"] for r in refused}) == 60  # each from its own address
        [summary] = [r for r in lines if r["action"] == HELD_BACK]
        assert summary["message"].startswith(f"{ADDRESSES - 60} more login records held back")
