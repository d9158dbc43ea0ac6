"""simulate(): many devices at once, each with its own id, stopped by an event; with cameras."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.simulator import SimulatedDevice, device_id_for, simulate
from gateway.simulator.fleet import BoardKind
from tests.device_fw.vision_server import ANSWER, vision_server
from tests.simulator.helpers import bound, mini_gateway

pytestmark = pytest.mark.anyio


def test_device_ids_are_locally_administered_macs() -> None:
    """Index 1 is 02:00:00:00:00:01; indices outside 1..65535 are refused."""
    assert device_id_for(1) == "02:00:00:00:00:01"
    assert device_id_for(258) == "02:00:00:00:01:02"
    with pytest.raises(ValueError):
        device_id_for(0)


async def test_simulate_runs_count_devices_until_stopped() -> None:
    """Three devices connect with distinct ids; setting stop_event ends them all."""
    stop = asyncio.Event()
    async with mini_gateway() as gw:
        runner = asyncio.create_task(simulate(gw.url, "t", 3, stop_event=stop), name="test.sim")
        for _ in range(3):
            await gw.next_connection()
        stop.set()
        with anyio.fail_after(bound()):
            await runner
        for _ in range(3):
            await gw.wait_ended()  # cleanly, or aborted if stopped mid-hello
    ids = sorted(r.headers["Device-Id"] for r in gw.requests)
    assert ids == ["02:00:00:00:00:01", "02:00:00:00:00:02", "02:00:00:00:00:03"]


async def test_simulate_can_run_our_firmware_board() -> None:
    """board="firmware" boots device_fw as a board does, on its simulated hardware."""
    stop = asyncio.Event()
    async with mini_gateway() as gw:
        runner = asyncio.create_task(
            simulate(gw.url, "t", 1, stop_event=stop, board="firmware"), name="test.sim"
        )
        await gw.next_connection()
        await gw.recv()  # the hello
        listing = await gw.request(1, "tools/list")
        stop.set()
        with anyio.fail_after(bound()):
            await runner
    names = [tool["name"] for tool in listing["result"]["tools"]]
    assert names[:3] == ["self.get_device_status", "self.led.set_power", "self.led.get_state"]
    assert "self.relay.set_power" in names and "self.reboot" not in names


@pytest.mark.parametrize("board", ["stock", "firmware"])
async def test_simulate_camera_boards_upload_to_the_vision_url(board: BoardKind) -> None:
    """camera=True (`simulate --camera`): the device lists self.camera.take_photo where its
    board would, refuses it before initialize passed a vision URL, and afterwards uploads a
    generated JPEG there and answers with the vision server's text."""
    stop = asyncio.Event()
    async with mini_gateway() as gw, vision_server() as (base, uploads):
        runner = asyncio.create_task(
            simulate(gw.url, "t", 1, stop_event=stop, board=board, camera=True), name="test.sim"
        )
        await gw.next_connection()
        await gw.recv()  # the hello
        listing = await gw.request(1, "tools/list")
        photo = {"name": "self.camera.take_photo", "arguments": {"question": "What is it?"}}
        before = await gw.request(2, "tools/call", **photo)
        vision = {"url": base + "/vision/explain", "token": "vision-token"}
        await gw.request(3, "initialize", capabilities={"vision": vision})
        after = await gw.request(4, "tools/call", **photo)
        stop.set()
        with anyio.fail_after(bound()):
            await runner
    names = [tool["name"] for tool in listing["result"]["tools"]]
    assert names.index("self.camera.take_photo") == (4 if board == "stock" else 1)
    assert before["error"]["message"] == "Image explain URL or token is not set"
    assert after["result"]["content"] == [{"type": "text", "text": ANSWER}]
    (upload,) = uploads
    assert upload.header("authorization") == "Bearer vision-token"
    assert upload.header("device-id") == device_id_for(1) and upload.question == "What is it?"
    assert upload.file[:3] == b"\xff\xd8\xff" and upload.file[-2:] == b"\xff\xd9"


async def test_simulated_devices_have_no_camera_unless_asked() -> None:
    """Without camera, neither board lists the camera tool, and vision is not kept."""
    async with mini_gateway() as gw:
        async with SimulatedDevice(gw.url, "t") as device:
            await gw.recv()
            await gw.request(1, "initialize", capabilities={"vision": {"url": "http://v/"}})
            listing = await gw.request(2, "tools/list", withUserTools=True)
    assert device.mcp.vision is None
    assert "self.camera.take_photo" not in {t["name"] for t in listing["result"]["tools"]}
