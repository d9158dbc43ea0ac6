"""No login takes over another device (issue 21): every way in, as an attacker on the LAN tries.

The attacker holds what is easy to get: the shared device token (on the flash of every board
running our firmware), a fresh per-board token, or an account of its own on an external broker.
Each test runs a real gateway with the real device beside it, and checks that the device keeps
its session and its calls, and that the attempt is refused, shown and audited.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiomqtt
import httpx2
import pytest
from mcp import Client
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.app import Running
from gateway.device_side.admission import INVALID
from tests.conftest import DEVICE_TOKEN, bound, gateway
from tests.e2e.helpers import has_tools, stock_headers, until
from tests.e2e.test_device_trust import EMBEDDED, IMPOSTOR, check_in, devices, listed_but_pending
from tests.e2e.test_mqtt import FIRMWARE, STOCK, stock_device, tool_name, wait_listed
from tests.mqtt_helpers import Mosquitto, MqttDevice

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

DOCS = Path(__file__).resolve().parents[2] / "docs"


async def mqtt_login(run: Running, device_id: str, password: str) -> None:
    """Log in to the embedded broker as ``device_id`` (client id and user name), then leave."""
    port = run.gateway.broker.port  # type: ignore[union-attr]
    async with aiomqtt.Client("127.0.0.1", port, username=device_id, password=password,
                              identifier=device_id, timeout=bound(5)):  # fmt: skip
        pass


def login_records(run: Running, device_id: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = run.gateway.audit.page(kind="login", device=device_id)[
        "records"
    ]
    return records


async def call_lamp(run: Running, device_id: str) -> None:
    async with Client(run.mcp_url, mode="legacy") as client:
        result = await client.call_tool(tool_name(run, device_id, "self.lamp.turn_on"), {})
    assert not result.is_error


async def test_no_token_takes_an_approved_stock_device_over_any_way_in(tmp_path: Path) -> None:
    """A stock device approved with `devices approve` is bound to its Client-Id. The shared
    token and a fresh per-board token over MQTT, the shared token over WebSocket and an OTA
    check-in with another Client-Id are all refused; the device keeps its session and gets
    the host's call; each attempt is an audit record with where it came from."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        registry = run.gateway.registry
        async with stock_device((await check_in(run)).json()) as device:
            await listed_but_pending(run)
            alias = registry.get(STOCK).alias  # type: ignore[union-attr]
            async with registry.changes() as changes:
                code, _, _ = await devices(run, "approve", alias)
                assert code == 0
                await until(changes, has_tools(run, STOCK))
            session = registry.get(STOCK).session  # type: ignore[union-attr]
            fresh = run.gateway.enrollment.issue("spare board")
            for secret in (DEVICE_TOKEN, fresh):
                with pytest.raises(aiomqtt.MqttCodeError):
                    await mqtt_login(run, STOCK, secret)
            headers = {**stock_headers(STOCK), "Client-Id": IMPOSTOR}
            with pytest.raises(InvalidStatus) as refused:
                async with connect(run.device_url, additional_headers=headers):
                    pass
            assert refused.value.response.status_code == 403
            assert (await check_in(run, IMPOSTOR)).status_code == 403
            await call_lamp(run, STOCK)
            shown = registry.get(STOCK)
            assert shown is not None and shown.session is session and shown.conflict
            assert device.calls == ["self.lamp.turn_on"]
        # The refused attempt did not use up the fresh token: a new board still gets it.
        assert run.gateway.admission.check("aa:00:00:00:00:77", fresh, client_id=None,
                                           transport="mqtt") is None  # fmt: skip
        records = login_records(run, STOCK)
        assert {r["caller"] for r in records} == {"mqtt", "websocket", "OTA"}
        assert all(r["action"] == "login conflict" and r["from"] == "127.0.0.1" for r in records)
        [approval] = run.gateway.audit.page(kind="admin")["records"]
        assert (approval["action"], approval["caller"], approval["device_id"]) == (
            "approve", "cli", STOCK)  # fmt: skip


async def test_a_board_with_its_own_token_refuses_the_shared_one_over_mqtt(tmp_path: Path) -> None:
    """Our firmware over MQTT with a per-board token is bound to that token: the shared token
    (which every board holds) and another board's token are refused; its own reconnects."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        port = run.gateway.broker.port  # type: ignore[union-attr]
        own, other = run.gateway.enrollment.issue("desk"), run.gateway.enrollment.issue("hall")
        board = MqttDevice("127.0.0.1", port, FIRMWARE, own, stock=False)
        async with board:
            await wait_listed(run, FIRMWARE)
            for secret in (DEVICE_TOKEN, other):
                with pytest.raises(aiomqtt.MqttCodeError):
                    await mqtt_login(run, FIRMWARE, secret)
            await call_lamp(run, FIRMWARE)
        assert board.calls == ["self.lamp.turn_on"]
        async with MqttDevice("127.0.0.1", port, FIRMWARE, own, stock=False) as again:
            await again.wait_connected()  # the same identity: in again, no conflict
        assert len(login_records(run, FIRMWARE)) == 1  # one a minute per device, the rest held


async def test_an_external_mosquitto_configured_as_documented_binds_identities(
    tmp_path: Path,
) -> None:
    """mqtt.mode = external with docs/mqtt.md's mosquitto settings: a holder of the shared
    token cannot log in as a device with its own password, and a board with an account of its
    own can neither take the device's client id nor write to or read its topics."""
    acl = re.search(r"# acl_file\n(.*?)```", (DOCS / "mqtt.md").read_text(), re.S)
    assert acl is not None, "docs/mqtt.md lost its mosquitto ACL"
    users = {"gateway": "gateway-secret", "esp-victim": "victim-own-token",
             "esp-other": DEVICE_TOKEN}  # fmt: skip
    async with Mosquitto(tmp_path / "mosquitto", users=users, acl=acl.group(1)) as broker:
        external = {"mqtt_mode": "external", "mqtt_host": "127.0.0.1", "mqtt_port": broker.port,
                    "mqtt_username": "gateway", "mqtt_password": "gateway-secret"}  # fmt: skip
        async with gateway(tmp_path / "gw", **external) as run:
            victim = MqttDevice("127.0.0.1", broker.port, "esp-victim", "victim-own-token",
                                stock=False)  # fmt: skip
            async with victim:
                await wait_listed(run, "esp-victim")
                with pytest.raises(aiomqtt.MqttCodeError):
                    async with aiomqtt.Client("127.0.0.1", broker.port, username="esp-victim",
                                              password=DEVICE_TOKEN, identifier="esp-victim",
                                              timeout=bound(5)):  # fmt: skip
                        pass
                registry = run.gateway.registry
                async with aiomqtt.Client("127.0.0.1", broker.port, username="esp-other",
                                          password=DEVICE_TOKEN, identifier="esp-victim",
                                          timeout=bound(5)) as other:  # fmt: skip
                    await other.subscribe("xiaozhi/esp-victim/down")
                    await other.publish("xiaozhi/esp-victim/status", b"offline", retain=True)
                    # Its own status goes after the forged one: once the gateway has it, it
                    # would have had the forged one too.
                    async with registry.device_changes() as changes:
                        await other.publish("xiaozhi/esp-other/status", b"online", retain=True)
                        await until(changes, lambda: bool(
                            (d := registry.get("esp-other")) and d.online))  # fmt: skip
                    assert registry.get("esp-victim").online  # type: ignore[union-attr]
                    await call_lamp(run, "esp-victim")
                    assert victim.calls == ["self.lamp.turn_on"]
                    assert len(other.messages) == 0  # it read none of the device's calls


async def test_a_made_up_token_is_refused_and_audited_once_a_minute(tmp_path: Path) -> None:
    """Guessing tokens for a device id nobody knows: every attempt is refused; the audit log
    gets one record for the address, which counts the attempts it held back."""
    async with gateway(tmp_path) as run:
        headers = {**stock_headers("02:00:00:00:0b:ad"), "Authorization": "Bearer guess"}
        for _ in range(5):
            with pytest.raises(InvalidStatus):
                async with connect(run.device_url, additional_headers=headers):
                    pass
        [record] = login_records(run, "02:00:00:00:0b:ad")
        said = (record["action"], record["caller"], record["from"], record["message"])
        assert said == ("login refused", "websocket", "127.0.0.1", INVALID)
        assert run.gateway.registry.get("02:00:00:00:0b:ad") is None


async def test_an_approval_the_disk_cannot_take_is_not_called_done(tmp_path: Path) -> None:
    """A data dir that cannot be written: `POST /api/devices/approve` answers 503 saying the
    change is not saved (and the audit log says so); once the disk takes it, it is written."""
    async with gateway(tmp_path, **EMBEDDED) as run:
        assert (await check_in(run)).status_code == 200
        store = run.gateway.store
        store._db.execute("PRAGMA query_only = ON")  # SQLite refuses every write, like a full disk
        url = f"http://127.0.0.1:{run.host_port}/api/devices/approve"
        async with httpx2.AsyncClient() as http:
            answer = await http.post(url, json={"device": STOCK})
        assert answer.status_code == 503 and "not saved" in answer.json()["error"]
        [record] = run.gateway.audit.page(kind="admin")["records"]
        assert (record["action"], record["outcome"]) == ("approve", "not saved")
        store._db.execute("PRAGMA query_only = OFF")
        await store.commit()
    async with gateway(tmp_path, **EMBEDDED) as again:
        assert again.gateway.registry.get(STOCK).record.state == "approved"  # type: ignore[union-attr]


async def test_no_secret_reaches_the_log_even_when_debugging(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At log level debug, a device that sends its token as a query parameter (as some clients
    do), a refused one, and MQTT logins with passwords leave none of those secrets in the log."""
    caplog.set_level("DEBUG")
    wrong = "not-the-token-but-maybe-another-one"
    async with gateway(tmp_path, **EMBEDDED) as run:
        for token in (DEVICE_TOKEN, wrong):
            url = f"{run.device_url}?device-id={FIRMWARE}&client-id={IMPOSTOR}&token={token}"
            try:
                async with connect(url, open_timeout=bound(5)):
                    pass
            except InvalidStatus:
                assert token == wrong
        for password in (DEVICE_TOKEN, wrong):
            try:
                await mqtt_login(run, "aa:00:00:00:00:78", password)
            except aiomqtt.MqttCodeError:
                assert password == wrong
    # The test's own clients (websockets.client, aiomqtt) log what they send: not the gateway.
    logged = "\n".join(r.getMessage() for r in caplog.records
                       if not r.name.startswith(("websockets.client", "aiomqtt")))  # fmt: skip
    assert "aa:00:00:00:00:78" in logged  # the broker logs the refused login
    assert DEVICE_TOKEN not in logged and wrong not in logged
