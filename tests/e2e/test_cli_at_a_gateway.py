"""The CLI against a running gateway as a person meets it (issue 42): a token refused or
missing, a device's tools, unknown names, and board commands that issue no token in vain."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.abc
import httpx2
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.app import Running
from tests.cli.flashing.test_board_commands import silent_port  # noqa: F401 - a fixture
from tests.cli.flashing.test_image import fake_firmware
from tests.conftest import bound, gateway
from tests.e2e.helpers import listed_device, stock_headers
from tests.e2e.test_stdio_and_cli import cli, cli_env

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM = "sim-esp32_0001"
HOST_TOKEN = "host-secret-0123456789"
BOARD = ["--name", "desk", "--wifi", "MyWiFi", "--wifi-password", "pw"]


def enrollments(run: Running) -> list[dict[str, object]]:
    assert run.gateway.enrollment is not None
    return run.gateway.enrollment.issued()


def enroll_records(run: Running) -> list[dict[str, object]]:
    """The audit log's records of issued and revoked device tokens, oldest first."""
    records = run.gateway.audit.page(kind="admin")["records"]
    return [r for r in reversed(records) if r["action"] in ("enroll", "revoke enrollment")]


async def test_a_wrong_host_token_reads_apart_from_a_missing_one(tmp_path: Path) -> None:
    """Missing: the gateway wants one; wrong: it refused this one. Both name the gateway."""
    async with gateway(tmp_path / "gw", host_token=HOST_TOKEN) as run:
        url = f"http://127.0.0.1:{run.host_port}"
        env = cli_env(tmp_path / "cli")
        code, _, missing = await cli("devices", "--url", url, env=env)
        assert code == 1 and f"the gateway at {url} wants a host token" in missing
        code, _, wrong = await cli("devices", "--url", url, "--token", "not-the-token", env=env)
        assert code == 1 and f"the gateway at {url} refused the host token" in wrong
        assert missing != wrong
        code, out, err = await cli("devices", "--url", url, "--token", HOST_TOKEN, env=env)
        assert code == 0, err


async def test_call_without_a_tool_lists_the_device_s_tools(tmp_path: Path) -> None:
    """`call DEVICE` prints what `devices show DEVICE` does; an unknown device names the
    commands that list devices and their tools."""
    async with gateway(tmp_path / "gw") as run, listed_device(run):
        url = f"http://127.0.0.1:{run.host_port}"
        env = cli_env(tmp_path / "cli")
        code, listed, err = await cli("call", SIM, "--url", url, env=env)
        assert code == 0, err
        assert "usage:" not in listed + err
        assert listed == (await cli("devices", "show", SIM, "--url", url, env=env))[1]
        assert f"{SIM}_audio_speaker_set_volume" in listed
        for args in (["call", "nosuch", "self.lamp.turn_on"], ["call", "nosuch"],
                     ["devices", "forget", "nosuch"]):  # fmt: skip
            code, _, err = await cli(*args, "--url", url, env=env)
            assert code == 1 and "unknown device 'nosuch'" in err, args
            assert "`esp-mcp-gateway devices`" in err and "`devices show DEVICE`" in err


async def test_a_failed_flash_issues_no_token(
    tmp_path: Path,
    silent_port: str,  # noqa: F811 - the fixture imported above
) -> None:
    """Failed tries (no port; no chip answering; a file that is not firmware; no place for the
    image; provision to no port) leave no token issued and nothing in the audit log; a try that
    fails after the gateway issued one (no URL a board could reach) revokes it again."""
    firmware = tmp_path / "ESP32_GENERIC.bin"
    firmware.write_bytes(fake_firmware("esp32"))
    not_firmware = tmp_path / "notes.txt"
    not_firmware.write_text("not firmware")
    async with gateway(tmp_path / "gw") as run:
        api = ["--api", f"http://127.0.0.1:{run.host_port}"]
        env = cli_env(tmp_path / "cli")
        tries = [
            ["flash", "--port", str(tmp_path / "ttyUSB97"), "--firmware", str(firmware)],
            ["flash", "--port", silent_port, "--firmware", str(firmware)],
            ["provision", "--port", str(tmp_path / "ttyACM97")],
            ["flash", "--port", "/dev/null", "--firmware", str(not_firmware)],
            ["image", "--firmware", str(firmware), "--output", str(tmp_path / "no" / "x.bin")],
        ]
        for args in tries:
            code, _, err = await cli(*args, *BOARD, *api, env=env)
            assert code == 1 and "Traceback" not in err, err
        assert enrollments(run) == [] and enroll_records(run) == []

        # Everything local is fine; the gateway, on loopback, has no URL to give the board.
        image = ["image", "--firmware", str(firmware), "--output", str(tmp_path / "desk.bin")]
        code, _, err = await cli(*image, *BOARD, *api, env=env)
        assert code == 1 and "--gateway" in err and "could not be revoked" not in err
        assert enrollments(run) == []
        assert [r["action"] for r in enroll_records(run)] == ["enroll", "revoke enrollment"]
        assert not (tmp_path / "desk.bin").exists()


async def test_issued_tokens_are_listed_audited_and_revoked(tmp_path: Path) -> None:
    """`image` registers the board; `enrollments` lists its token; revoked, it admits nobody."""
    firmware = tmp_path / "ESP32_GENERIC.bin"
    firmware.write_bytes(fake_firmware("esp32"))
    async with gateway(tmp_path / "gw") as run:
        url = f"http://127.0.0.1:{run.host_port}"
        env = cli_env(tmp_path / "cli")
        image = ["image", "--firmware", str(firmware), "--output", str(tmp_path / "desk.bin"),
                 "--gateway", run.device_url]  # fmt: skip
        code, _, err = await cli(*image, *BOARD, "--api", url, env=env)
        assert code == 0, err
        [issued] = enrollments(run)
        code, table, err = await cli("enrollments", "--url", url, env=env)
        assert code == 0, err
        assert issued["id"] in table and "desk" in table and "not used yet" in table
        [record] = enroll_records(run)
        assert record["caller"] == "cli" and record["device"] == "desk"

        async with httpx2.AsyncClient() as http:  # a second board, through the API
            bench = (await http.post(url + "/api/enroll", json={"name": "bench"})).json()
        device_id = "aa:42:00:00:00:01"
        headers = {**stock_headers(device_id), "Authorization": f"Bearer {bench['token']}"}
        with anyio.fail_after(bound(10)):
            async with connect(run.device_url, additional_headers=headers):
                pass  # the board's token admits it
        code, table, _ = await cli("enrollments", "--url", url, env=env)
        assert device_id in table and issued["id"] in table and bench["id"] in table

        code, out, err = await cli("enrollments", "revoke", bench["id"], "--url", url, env=env)
        assert code == 0, err
        assert f"revoked {bench['id']}" in out
        assert [e["id"] for e in enrollments(run)] == [issued["id"]]
        assert [r["action"] for r in enroll_records(run)] == [
            "enroll", "enroll", "revoke enrollment"
        ]  # fmt: skip
        with anyio.fail_after(bound(10)), pytest.raises(InvalidStatus):
            async with connect(run.device_url, additional_headers=headers):
                pass
        code, _, err = await cli("enrollments", "revoke", bench["id"], "--url", url, env=env)
        assert code == 1 and "no enrollment" in err


async def test_something_else_at_the_url_is_named_not_taken_for_the_gateway(tmp_path: Path) -> None:
    """A web server that is not the gateway's host listener answers 200 with a page: the CLI
    says it is not the gateway, rather than failing on the page."""

    async def page(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            await stream.receive()
            body = b"<html>a router's admin page</html>"
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            await stream.send(head.encode() + body)

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, page)
        code, _, err = await cli("devices", "--url", f"http://127.0.0.1:{port}",
                                 env=cli_env(tmp_path))  # fmt: skip
        tg.cancel_scope.cancel()
    assert code == 1 and "not as the gateway does" in err and "Traceback" not in err
