"""The device listener's front: device WebSockets bypass Starlette's per-connection layers.

Each idle device WebSocket that went through Starlette's middleware and router would keep their
coroutine frames for its whole life (kilobytes a device in a fleet of thousands). These tests
count which connections reach the Starlette app behind the front, on a real gateway.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.device_side.transports.device_socket import DeviceSocket
from gateway.device_side.transports.websocket import DeviceSocketFront
from gateway.simulator import SimulatedDevice
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.e2e.helpers import has_tools, listed_device, until

pytestmark = pytest.mark.anyio


class Counting:
    """An ASGI app that records the scope types and paths it is given, then runs ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            self.seen.append((scope["type"], scope["path"]))
        await self.app(scope, receive, send)


async def test_device_websockets_skip_the_starlette_app(tmp_path: Path) -> None:
    async with gateway(tmp_path) as run:
        front = run.gateway.device_app
        assert isinstance(front, DeviceSocketFront)
        counting = front.app = Counting(front.app)
        # Both spellings of the device path, as stock firmware and other clients use them.
        async with listed_device(run, "02:00:00:00:00:01"):
            pass
        slashless = run.device_url.rstrip("/")
        async with run.gateway.registry.changes() as changes:
            async with SimulatedDevice(slashless, DEVICE_TOKEN, device_id="02:00:00:00:00:02"):
                await until(changes, has_tools(run, "02:00:00:00:00:02"))
        assert counting.seen == []  # the device WebSockets never reached the Starlette app

        base = f"http://127.0.0.1:{run.device_port}"
        async with httpx2.AsyncClient(timeout=bound(5)) as client:
            health = await client.get(f"{base}/healthz")
        assert health.json() == {"status": "ok"}
        with pytest.raises(InvalidStatus):  # any other WebSocket path: Starlette's router refuses
            async with connect(
                f"ws://127.0.0.1:{run.device_port}/elsewhere", open_timeout=bound(5)
            ):
                pass
        assert counting.seen == [("http", "/healthz"), ("websocket", "/elsewhere")]


async def test_a_refused_device_websocket_is_still_refused_before_the_upgrade(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as run:
        headers = {"Authorization": f"Bearer not-{DEVICE_TOKEN}", "Device-Id": "02:00:00:00:00:09"}
        with pytest.raises(InvalidStatus) as refused:
            async with connect(run.device_url, additional_headers=headers, open_timeout=bound(5)):
                pass
        assert refused.value.response.status_code == 403


async def test_a_join_writes_the_frames_of_each_turn_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A joining device's frames that the gateway has in the same loop turn (the answer to
    its hello and ``initialize``) go in one write: one send system call, not one a frame."""
    writes: list[int] = []  # frames in each write to a device socket's transport
    write = DeviceSocket._write

    def counted(socket: DeviceSocket) -> None:
        frames = len(socket.conn.writes)  # what the parser and sends queued since the last
        if frames:
            writes.append(frames)
        write(socket)

    monkeypatch.setattr(DeviceSocket, "_write", counted)
    async with gateway(tmp_path) as run:
        async with listed_device(run, "02:00:00:00:00:01"):
            pass
    assert writes[:2] == [1, 2], writes  # the 101; the hello's answer with initialize
