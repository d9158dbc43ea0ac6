"""The firmware's camera (fw_camera, fw_http, fw_jpeg): self.camera.take_photo uploads the
simulated board's photo to a real HTTP server exactly as stock firmware does
(docs/protocol.md §5), on CPython and on the MicroPython unix port."""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from device_fw.fw_board import SimBoard
from device_fw.fw_camera import BOUNDARY, DESCRIPTION, form
from device_fw.fw_config import DEFAULTS, merge
from device_fw.fw_http import MAX_ANSWER
from device_fw.fw_jpeg import solid
from tests.conftest import bound, program
from tests.device_fw.conftest import TESTS, micropython_env
from tests.device_fw.vision_server import ANSWER, vision_server

sys.path.append(str(TESTS))  # camera_scenario imports the firmware by its board names
import camera_scenario  # noqa: E402

pytestmark = pytest.mark.anyio

Replies = dict[str, Any]
Scenario = Callable[[str], Coroutine[Any, Any, Replies]]


async def on_cpython(base: str) -> Replies:
    replies: Replies = {}
    async with asyncio.timeout(bound(30)):
        await camera_scenario.run(base, replies.__setitem__)
    return replies


async def on_micropython(base: str) -> Replies:
    process = await asyncio.create_subprocess_exec(
        program("micropython"),
        str(TESTS / "camera_scenario.py"),
        base,
        env=micropython_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), bound(60))
    assert process.returncode == 0, output.decode()
    lines = [json.loads(line) for line in output.decode().splitlines() if line.startswith("{")]
    return {line["case"]: line["reply"] for line in lines}


RUNTIMES = [on_cpython, on_micropython]
IDS = ["cpython", "micropython"]


def text_of(reply: Any) -> str:
    assert reply["id"] == 7 and reply["result"]["isError"] is False, reply
    assert "structuredContent" not in reply["result"]
    (item,) = reply["result"]["content"]
    text: str = item["text"]
    return text


def error_of(reply: Any) -> str:
    assert reply["id"] == 7 and "result" not in reply, reply
    message: str = reply["error"]["message"]
    return message


def check_jpeg(data: bytes) -> tuple[int, int, bytes]:
    """Walk a baseline JPEG's segments; return (width, height, comment)."""
    assert data[:3] == b"\xff\xd8\xff" and data[-2:] == b"\xff\xd9", data[:4] + data[-4:]
    at, size, comment = 2, None, b""
    while True:
        assert data[at] == 0xFF, at
        marker, length = data[at + 1], struct.unpack(">H", data[at + 2 : at + 4])[0]
        payload = data[at + 4 : at + 2 + length]
        if marker == 0xC0:  # baseline, 8-bit, three components
            precision, height, width, count = struct.unpack(">BHHB", payload[:6])
            assert precision == 8 and count == 3
            size = (width, height)
        elif marker == 0xFE:
            comment = payload
        at += 2 + length
        if marker == 0xDA:
            break
    scan = data[at:-2]
    assert b"\xff" not in scan.replace(b"\xff\x00", b""), "unstuffed 0xFF in the scan"
    assert size is not None
    return size[0], size[1], comment


@pytest.mark.parametrize("scenario", RUNTIMES, ids=IDS)
async def test_take_photo_uploads_like_stock_and_returns_the_answer(scenario: Scenario) -> None:
    """The upload is stock's request: POST to the vision URL with Device-Id, Client-Id, the
    bearer token (none when the token is empty), multipart with the question then
    camera.jpg; the server's whole answer, as is, is the tool's result."""
    async with vision_server() as (base, uploads):
        replies = await scenario(base)
    assert text_of(replies["ok"]) == ANSWER
    assert text_of(replies["no_token"]) == ANSWER
    assert text_of(replies["chunked"]) == "A streamed answer, in three pieces"
    ok, no_token = uploads[0], uploads[1]
    assert [upload.path for upload in uploads] == ["/vision/explain"] * 2 + [
        "/chunked", "/refused", "/too-long"
    ]  # fmt: skip
    host = base.removeprefix("http://")
    assert ok.headers == [
        ("host", host),
        ("device-id", camera_scenario.DEVICE_ID),
        ("client-id", camera_scenario.CLIENT_ID),
        ("authorization", "Bearer vision-token"),
        ("content-type", f"multipart/form-data; boundary={BOUNDARY}"),
        ("content-length", str(len(ok.body))),
        ("connection", "close"),
    ]
    assert no_token.header("authorization") is None
    assert no_token.header("device-id") == camera_scenario.DEVICE_ID
    for upload in uploads:
        assert upload.question == camera_scenario.QUESTION
        assert upload.filename == "camera.jpg" and upload.file_type == "image/jpeg"
        assert upload.body == b"".join(form(camera_scenario.QUESTION, upload.file))
    assert ok.body.startswith(
        b"------ESP32_CAMERA_BOUNDARY\r\n"
        b'Content-Disposition: form-data; name="question"\r\n\r\n'
        + camera_scenario.QUESTION.encode()
        + b"\r\n------ESP32_CAMERA_BOUNDARY\r\n"
        b'Content-Disposition: form-data; name="file"; filename="camera.jpg"\r\n'
        b"Content-Type: image/jpeg\r\n\r\n\xff\xd8\xff"
    )
    assert ok.body.endswith(b"\xff\xd9\r\n------ESP32_CAMERA_BOUNDARY--\r\n")


@pytest.mark.parametrize("scenario", RUNTIMES, ids=IDS)
async def test_take_photo_failures_are_clear_errors(scenario: Scenario) -> None:
    """No vision URL yet, a refusal (with the server's reason), an answer too long for a tool
    result, an unreachable server and a camera that takes nothing: each a JSON-RPC error."""
    async with vision_server() as (base, _uploads):
        replies = await scenario(base)
    assert error_of(replies["no_url"]) == "Image explain URL or token is not set"
    assert error_of(replies["refused"]) == (
        "Failed to upload photo: HTTP 401 invalid vision token for this device"
    )
    assert error_of(replies["too_long"]) == (
        f"Failed to upload photo: the answer is over {MAX_ANSWER} bytes"
    )
    assert error_of(replies["unreachable"]).startswith("Failed to upload photo: ")
    assert error_of(replies["no_photo"]) == "Failed to capture photo"


@pytest.mark.parametrize("scenario", RUNTIMES, ids=IDS)
async def test_the_simulated_camera_takes_a_new_valid_jpeg_each_time(scenario: Scenario) -> None:
    """Every photo the simulated board uploads is a baseline JPEG (FF D8 FF ... FF D9) of
    160x120 whose comment numbers it, so no two are alike. (Photo 1 went nowhere: like stock,
    the tool captures before it finds that no vision URL is set.)"""
    async with vision_server() as (base, uploads):
        await scenario(base)
    photos = [upload.file for upload in uploads]
    assert len(set(photos)) == len(photos) == 5
    for number, photo in enumerate(photos, start=2):
        assert check_jpeg(photo) == (
            160, 120, b"esp-mcp-gateway simulated camera, photo %d" % number
        )  # fmt: skip


def test_jpeg_sizes_that_are_not_whole_blocks_and_stuffed_bytes() -> None:
    """Any size is encoded (partial 8x8 blocks included); a 0xFF byte in the scan is stuffed."""
    for width, height in ((1, 1), (13, 9), (640, 480)):
        for rgb in ((0, 0, 0), (255, 255, 255), (255, 0, 128)):
            assert check_jpeg(solid(width, height, rgb, b"c"))[:2] == (width, height)


def test_only_a_board_with_a_camera_captures() -> None:
    """SimBoard takes photos only with config "camera": true; the base board never does."""
    assert SimBoard(merge(DEFAULTS, {})).capture() is None
    board = SimBoard(merge(DEFAULTS, {"camera": True}))
    assert board.camera is True and board.capture() != board.capture()


def test_the_tool_is_declared_like_stock() -> None:
    """Stock's name, description and inputSchema (question, a required string)."""
    server = camera_scenario.server_for(True)
    listed = server.page()["tools"][0]
    assert listed["name"] == "self.camera.take_photo"
    assert listed["description"] == DESCRIPTION
    assert DESCRIPTION.startswith("Always remember you have a camera.")
    assert listed["inputSchema"] == {
        "type": "object",
        "properties": {"question": {"type": "string"}},
        "required": ["question"],
    }


@pytest.mark.parametrize("scenario", RUNTIMES, ids=IDS)
async def test_the_firmware_offers_the_camera_only_on_a_camera_board(scenario: Scenario) -> None:
    """fw_app.build lists self.camera.take_photo right after the status tool when config
    "camera" is true, and not at all otherwise."""
    async with vision_server() as (base, _uploads):
        replies = await scenario(base)
    assert replies["booted_camera"][:2] == ["self.get_device_status", "self.camera.take_photo"]
    assert replies["booted_camera"][2:] == replies["booted"][1:]
