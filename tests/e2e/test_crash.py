"""What a user is told is done stays done (issue 21): SIGKILL in the middle of their changes.

The gateway runs as users run it (``python -m gateway serve``, a subprocess); stock devices
check in through OTA and wait for approval; the user approves, rejects, renames and forgets
them through the API as fast as the gateway answers, and the gateway is killed (SIGKILL: no
shutdown, no last write) while the changes still stream in. After a restart every change that
was answered 200 is there.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path

import anyio
import httpx2
import pytest

from tests.conftest import bound, gateway
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS
from tests.e2e.test_first_hour import read_until
from tests.e2e.test_stdio_and_cli import cli_env
from tests.ports import announced_ports

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DEVICES = 240
KILL_AFTER = 60  # acknowledged changes before the kill; more are in flight when it lands
WORKERS = 4
ACTIONS = ("approve", "reject", "rename", "forget")


def device_id(n: int) -> str:
    return f"aa:bb:cc:00:{n // 256:02x}:{n % 256:02x}"


async def check_in_all(http: httpx2.AsyncClient, base: str) -> None:
    for n in range(DEVICES):
        headers = {**STOCK_HEADERS, "Device-Id": device_id(n), "Client-Id": f"client-{n}"}
        response = await http.post(f"{base}/xiaozhi/ota/", headers=headers, json=STOCK_BODY)
        assert response.status_code == 200, response.text


async def change(http: httpx2.AsyncClient, base: str, n: int) -> bool:
    """The user's change to device ``n``; True when the gateway said it is done."""
    action = ACTIONS[n % len(ACTIONS)]
    body = {"device": device_id(n)}
    if action == "rename":
        body["name"] = f"renamed_{n}"
    try:
        response = await http.post(f"{base}/api/devices/{action}", json=body)
    except httpx2.TransportError:
        return False  # killed before it answered: the user was never told
    return response.status_code == 200


async def test_every_acknowledged_change_survives_a_sigkill(tmp_path: Path) -> None:
    """Approve, reject, rename and forget in four parallel loops; SIGKILL after 60 answers;
    after a restart each answered change is in the registry."""
    data = tmp_path / "data"
    env = cli_env(data, GATEWAY_DEVICE_LISTEN="127.0.0.1:0", GATEWAY_HOST_LISTEN="127.0.0.1:0",
                  GATEWAY_OTA_TRANSPORT="websocket")  # fmt: skip
    process = await anyio.open_process([sys.executable, "-m", "gateway", "serve"], env=env)
    acknowledged: list[int] = []
    killed = anyio.Event()
    try:
        ports = announced_ports("\n".join(await read_until(process, "MCP hosts connect to")))
        device_port, host_port = ports["devices"], ports["hosts"]  # it bound port 0
        async with httpx2.AsyncClient(timeout=bound(10)) as http:
            await check_in_all(http, f"http://127.0.0.1:{device_port}")
            host = f"http://127.0.0.1:{host_port}"

            async def worker(first: int) -> None:
                for n in range(first, DEVICES, WORKERS):
                    if killed.is_set():
                        return
                    if await change(http, host, n):
                        acknowledged.append(n)
                    if len(acknowledged) >= KILL_AFTER and not killed.is_set():
                        process.send_signal(signal.SIGKILL)
                        killed.set()

            with anyio.fail_after(bound(60)):
                async with anyio.create_task_group() as workers:
                    for first in range(WORKERS):
                        workers.start_soon(worker, first)
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed already, as it should be
            process.kill()
        await process.wait()
        await process.aclose()
    assert killed.is_set()
    assert len(acknowledged) >= KILL_AFTER

    async with gateway(data) as again:
        registry = again.gateway.registry
        lost = []
        for n in acknowledged:
            device, action = registry.get(device_id(n)), ACTIONS[n % len(ACTIONS)]
            kept = {
                "approve": device is not None and device.record.state == "approved",
                "reject": device is not None and device.record.state == "rejected",
                "rename": device is not None and device.alias == f"renamed_{n}",
                "forget": device is None,
            }[action]
            if not kept:
                lost.append((action, device_id(n)))
    assert not lost, f"{len(lost)} of {len(acknowledged)} acknowledged changes lost: {lost}"
