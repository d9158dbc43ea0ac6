"""With a voice proxy configured, the device path is still served below ASGI (``DeviceSocket``,
which the proxy takes over for a proxied device): a session that fails ends with 1011."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.app import Running
from gateway.cluster.bridge import BridgedLink
from gateway.device_side.transports import websocket
from gateway.device_side.transports.device_socket import DeviceSocket
from gateway.device_side.transports.websocket import DeviceSocketFront
from tests.cluster.conftest import replicas
from tests.conftest import gateway
from tests.e2e.helpers import fail_catalogue_of, join_listing_no_tools, listed_device
from tests.mqtt_helpers import Mosquitto

pytestmark = pytest.mark.anyio

BROKEN = "02:00:00:00:00:41"  # the device whose tool list the gateway fails to handle
# A voice proxy configured: the device path is served below ASGI all the same. The devices
# here never check in through it, so none is proxied; no voice server needs to listen.
PROXY = {"upstream_ota_url": "http://127.0.0.1:9/xiaozhi/ota/"}


async def _fails_with_1011_and_spares_the_other(run: Running) -> None:
    front = run.gateway.device_app
    assert isinstance(front, DeviceSocketFront) and front.sockets is not None  # below ASGI
    async with listed_device(run) as other:
        link = run.gateway.registry.get(other.device_id)
        assert link is not None and link.session is not None
        held = getattr(link.session, "_link", None)
        inner = held.inner if isinstance(held, BridgedLink) else held
        assert isinstance(inner, DeviceSocket)
        assert await join_listing_no_tools(run.device_url, BROKEN) == 1011
        device = run.gateway.registry.get(BROKEN)
        assert device is not None and not device.online and device.session is None
        result = await link.session.call("self.lamp.get_state", {})
        assert not result.get("isError"), result


def _logged_once(caplog: pytest.LogCaptureFixture) -> None:
    failures = [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR]
    assert [(r.name, r.getMessage()) for r in failures] == [
        (websocket.__name__, f"WebSocket device {BROKEN}: session failed")
    ]
    assert "the registry broke on this device" in str(failures[0].exc_info)


async def test_a_failed_session_beside_a_voice_proxy_closes_with_1011(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The registry fails on one device's tool list: that device gets 1011 (not 1000, which it
    takes for a normal close), the failure is logged once, and another device stays served."""
    fail_catalogue_of(monkeypatch, BROKEN)
    async with gateway(tmp_path, **PROXY) as run:
        await _fails_with_1011_and_spares_the_other(run)
    _logged_once(caplog)


@pytest.mark.e2e
async def test_a_failed_bridged_session_beside_a_voice_proxy_closes_with_1011(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same on a cluster replica, where the socket's link is bridged onto the broker."""
    fail_catalogue_of(monkeypatch, BROKEN)
    async with Mosquitto(tmp_path / "broker") as broker:
        async with replicas(tmp_path, broker.port, 1, **PROXY) as (run,):
            await _fails_with_1011_and_spares_the_other(run)
    _logged_once(caplog)
