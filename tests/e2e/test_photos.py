"""Photos reach the host: a camera device's upload comes back as the call's image and resource."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp.types as types
import pytest
from mcp import Client

from device_fw.fw_board import COLOURS
from device_fw.fw_jpeg import solid
from gateway.app import Running
from gateway.devices.photos import photo_uri
from gateway.simulator.fleet import firmware_device
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.e2e.camera import STATUS, TAKE_PHOTO, StockCamera, fake_jpeg
from tests.e2e.helpers import Inbox, aliases, has_tools, serving, until
from tests.e2e.test_stdio_and_cli import cli, cli_env, stdio_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

QUESTION = "What is on the table?"


def camera(n: int = 1, **kwargs: Any) -> StockCamera:
    return StockCamera(f"aa:bb:cc:dd:ee:{n:02x}", f"cam{n}", [TAKE_PHOTO, STATUS], **kwargs)


@asynccontextmanager
async def cameras(tmp_path: Path, *devices: StockCamera, **config: Any) -> AsyncIterator[Running]:
    async with gateway(tmp_path, devices=aliases(*devices), **config) as run:
        async with serving(run, *devices):
            yield run


def images(result: types.CallToolResult) -> list[bytes]:
    return [
        base64.b64decode(block.data)
        for block in result.content
        if isinstance(block, types.ImageContent)
    ]


def texts(result: types.CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def take_photo(client: Client, device: StockCamera) -> types.CallToolResult:
    with anyio.fail_after(bound(10)):
        return await client.call_tool(device.mcp_name(TAKE_PHOTO["name"]), {"question": QUESTION})


async def test_a_stock_camera_s_photo_reaches_the_host_over_http(tmp_path: Path) -> None:
    """The call returns the device's text, the photo itself as an image, and a resource link."""
    cam = camera()
    async with cameras(tmp_path, cam) as run, Client(run.mcp_url) as client:
        assert cam.vision is not None
        assert cam.vision["url"] == f"http://127.0.0.1:{run.device_port}/vision/explain"
        result = await take_photo(client, cam)
        assert not result.is_error, texts(result)
        assert images(result) == [cam.photo]
        answer = json.loads(result.content[0].text)  # what the device returned, verbatim
        assert answer["success"] is True and QUESTION in answer["result"]
        (link,) = [b for b in result.content if isinstance(b, types.ResourceLink)]
        assert str(link.uri) == photo_uri("cam1") and link.mime_type == "image/jpeg"

        listed = await client.list_resources()
        assert [str(r.uri) for r in listed.resources] == [photo_uri("cam1")]
        read = await client.read_resource(photo_uri("cam1"))
        (contents,) = read.contents
        assert isinstance(contents, types.BlobResourceContents)
        assert base64.b64decode(contents.blob) == cam.photo
        photo_file = tmp_path / "photos" / "aa%3Abb%3Acc%3Add%3Aee%3A01.jpg"
        assert photo_file.read_bytes() == cam.photo and photo_file.stat().st_mode & 0o077 == 0
        # Outside a call, even the right token has nothing to upload to.
        status, body = await cam.upload("unasked")
        assert status == 409 and "no call of this device is waiting" in body


async def test_a_png_with_a_script_appended_is_served_as_a_png_never_sniffed(
    tmp_path: Path,
) -> None:
    """/api/photos serves exactly image/png with nosniff: the browser never runs the script."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(64) + b"<html><script>alert(document.cookie)</script>"
    cam = camera(photo=png)
    async with cameras(tmp_path, cam) as run, Client(run.mcp_url) as client:
        assert not (await take_photo(client, cam)).is_error
        url = f"http://127.0.0.1:{run.host_port}/api/photos"
        async with httpx2.AsyncClient(timeout=bound(10)) as http:
            served = await http.get(f"{url}/{cam.device_id}/latest")
            listing = await http.get(url)
            missing = await http.get(f"{url}/nosuch/latest")
    assert served.status_code == 200 and served.content == png
    assert served.headers["content-type"] == "image/png"  # no charset, nothing else
    for response in (served, listing, missing):
        assert response.headers["x-content-type-options"] == "nosniff"
    assert missing.status_code == 404


async def test_call_save_writes_the_photo_to_a_file(tmp_path: Path) -> None:
    """`esp-mcp-gateway call DEVICE self.camera.take_photo '{...}' --save photo.jpg`."""
    cam = camera()
    async with cameras(tmp_path / "gw", cam) as run:
        saved = tmp_path / "photo.jpg"
        code, out, err = await cli(
            "call", "--url", f"http://127.0.0.1:{run.host_port}", "cam1", TAKE_PHOTO["name"],
            json.dumps({"question": QUESTION}), "--save", str(saved), env=cli_env(tmp_path / "cli"),
        )  # fmt: skip
        assert code == 0, err
        assert saved.read_bytes() == cam.photo
        assert f"saved {len(cam.photo)} bytes (image/jpeg)" in err
        assert "[image: image/jpeg" in out and len(out) < 1000  # a note, not 4 KB of base64
        code, _, err = await cli(
            "call", "--url", f"http://127.0.0.1:{run.host_port}", "cam1", STATUS["name"],
            "--save", str(tmp_path / "none.jpg"), env=cli_env(tmp_path / "cli"),
        )  # fmt: skip
        assert code == 1 and "returned no image to save" in err


async def test_the_last_photo_survives_a_restart(tmp_path: Path) -> None:
    """resources/read after a restart returns the photo taken before it."""
    cam = camera()
    async with cameras(tmp_path, cam) as run, Client(run.mcp_url) as client:
        await take_photo(client, cam)
    async with gateway(tmp_path, devices=aliases(cam)) as run, Client(run.mcp_url) as client:
        read = await client.read_resource(photo_uri("cam1"))
        assert base64.b64decode(read.contents[0].blob) == cam.photo
        with pytest.raises(Exception, match="has no photo"):
            await client.read_resource(photo_uri("nosuch"))


async def test_a_device_keeps_its_last_photos_and_hosts_hear_of_each(tmp_path: Path) -> None:
    """With photo_history = 3, four photos leave the last three as resources (the latest and
    two older ones, each under its own URI), the first one gone from the disk; each photo
    pushes notifications/resources/list_changed; the history survives a restart."""
    cam = camera()
    inbox = Inbox(types.ResourceListChangedNotification)
    async with (
        cameras(tmp_path, cam, vision_photo_history=3) as run,
        Client(run.mcp_url, mode="legacy", message_handler=inbox) as client,
    ):
        assert client.server_capabilities.resources.list_changed is True  # type: ignore[union-attr]
        for _ in range(4):
            await take_photo(client, cam)
            await inbox.next_change()
        uris = [str(r.uri) for r in (await client.list_resources()).resources]
        kept = run.gateway.photos.history(cam.device_id)
    assert inbox.count == 4
    assert len(kept) == 3 and uris == [photo_uri("cam1")] + [
        photo_uri("cam1", photo.id) for photo in kept[1:]
    ]
    assert len(list((tmp_path / "photos").glob("*.jpg"))) == 3
    async with gateway(tmp_path, devices=aliases(cam), vision_photo_history=3) as run:
        async with Client(run.mcp_url) as client:
            oldest = await client.read_resource(uris[-1])
            assert base64.b64decode(oldest.contents[0].blob) == cam.photo  # type: ignore[union-attr]
            with pytest.raises(Exception, match="has no photo 1 "):
                await client.read_resource(photo_uri("cam1", "1"))


FIRMWARE_ID = "02:00:00:00:0c:01"


def first_firmware_photo() -> bytes:
    """The JPEG our firmware's simulated board generates as its first photo (fw_board.py)."""
    comment = b"esp-mcp-gateway simulated camera, photo 1"
    return bytes(solid(160, 120, COLOURS[1 % len(COLOURS)], comment))


async def test_the_firmware_camera_s_photo_reaches_the_host_over_http(tmp_path: Path) -> None:
    """Our firmware (simulated board, CPython) uploads as stock does; the host sees the photo."""
    async with gateway(tmp_path) as run, run.gateway.registry.changes() as changes:
        async with anyio.create_task_group() as tg:
            device = firmware_device(run.device_url, DEVICE_TOKEN, FIRMWARE_ID, camera=True)
            tg.start_soon(device.run)
            await until(changes, has_tools(run, FIRMWARE_ID))
            async with Client(run.mcp_url) as client:
                arguments = {"question": QUESTION}
                with anyio.fail_after(bound(10)):
                    result = await client.call_tool(
                        "call_device_tool",
                        {
                            "device": FIRMWARE_ID,
                            "tool": "camera.take_photo",
                            "arguments": arguments,
                        },
                    )
                assert not result.is_error, texts(result)
                assert images(result) == [first_firmware_photo()]
                assert "attached to this result as an image" in texts(result)
                alias = run.gateway.registry.get(FIRMWARE_ID).alias  # type: ignore[union-attr]
                read = await client.read_resource(photo_uri(alias))
                assert base64.b64decode(read.contents[0].blob) == first_firmware_photo()
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("board", ["stock", "firmware"])
async def test_a_camera_s_photo_reaches_a_stdio_host(tmp_path: Path, board: str) -> None:
    """The same over stdio (Claude Desktop's transport), with the gateway as a subprocess."""
    params, url = stdio_gateway(tmp_path)
    inbox = Inbox()
    async with (
        Client(params, mode="legacy", message_handler=inbox) as client,
        anyio.create_task_group() as tg,
    ):
        await client.list_tools()
        if board == "stock":
            cam = StockCamera("aa:bb:cc:dd:ee:07", "unused", [TAKE_PHOTO, STATUS])
            await tg.start(cam.serve, url)
            expected = cam.photo
        else:
            tg.start_soon(firmware_device(url, DEVICE_TOKEN, FIRMWARE_ID, camera=True).run)
            expected = first_firmware_photo()
        while not any(
            t.name.endswith("camera_take_photo") for t in (await client.list_tools()).tools
        ):
            await inbox.next_change()  # the gateway pushes list_changed once it has the tools
        found = json.loads((await client.call_tool("list_devices", {})).content[0].text)
        alias = found["devices"][0]["device"]  # named by the gateway from the board
        result = await client.call_tool(
            "call_device_tool",
            {"device": alias, "tool": "camera.take_photo", "arguments": {"question": QUESTION}},
        )
        assert not result.is_error, texts(result)
        assert images(result) == [expected]
        read = await client.read_resource(photo_uri(alias))
        assert base64.b64decode(read.contents[0].blob) == expected
        tg.cancel_scope.cancel()


async def test_wrong_or_another_device_s_token_is_refused(tmp_path: Path) -> None:
    """Only the token given to a device opens the upload for it; the call says it failed."""
    forger = camera(1, token="not-the-token")
    impostor = camera(2)  # uploads with its own token but device 3's id
    victim = camera(3)
    async with cameras(tmp_path, forger, impostor, victim) as run, Client(run.mcp_url) as client:
        assert impostor.vision is not None and victim.vision is not None
        assert impostor.vision["token"] != victim.vision["token"]
        result = await take_photo(client, forger)
        assert result.is_error and "Failed to upload photo" in texts(result)
        assert forger.uploads == [401] and images(result) == []
        impostor.upload_as = victim.device_id
        async with anyio.create_task_group() as tg:  # the victim is even waiting for a photo
            tg.start_soon(take_photo, client, victim)
            result = await take_photo(client, impostor)
        assert impostor.uploads == [401] and images(result) == []
        assert victim.uploads == [200]
        assert run.gateway.photos.latest(victim.device_id).read() == victim.photo  # type: ignore[union-attr]


async def test_an_oversize_or_non_image_upload_is_refused_and_the_call_says_why(
    tmp_path: Path,
) -> None:
    """The call ends with a clear result naming the limit, or saying it was not an image."""
    big = camera(1, photo=fake_jpeg(40_000))
    text = camera(2, photo=b"<html>not a photo</html>")
    async with cameras(tmp_path, big, text, vision_max_photo_bytes=16_384) as run:
        async with Client(run.mcp_url) as client:
            result = await take_photo(client, big)
            assert result.is_error and big.uploads in ([413], [0])
            assert "Failed to upload photo" in texts(result)
            assert "larger than the gateway's limit of 16 KiB" in texts(result)
            result = await take_photo(client, text)
            assert result.is_error and text.uploads == [415]
            assert "not a JPEG or PNG image" in texts(result)
            assert (await client.list_resources()).resources == []


async def test_an_upload_token_dies_with_its_session(tmp_path: Path) -> None:
    """A token seen on the wire is worthless once the device has reconnected."""
    first = camera()
    async with cameras(tmp_path, first) as run:
        assert first.vision is not None
        old = first.vision["token"]
        await first.close()
        again = camera(token=old)  # the same device, presenting its previous session's token
        async with serving(run, again), Client(run.mcp_url) as client:
            assert again.vision is not None and again.vision["token"] != old
            result = await take_photo(client, again)
            assert result.is_error and again.uploads == [401]
