"""The cluster broker's logins checked by the gateway (EMQX HTTP authentication)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gateway.app import Running, running
from gateway.cluster.broker_auth import ALLOW, DENY, IGNORE, PATH, BrokerAuth
from gateway.config import ListenAddress
from gateway.device_side.broker.credentials import DeviceCredentials
from tests.cluster.conftest import cluster_options
from tests.conftest import bound, gateway, make_config
from tests.mqtt_helpers import Mosquitto
from tests.ports import refusing_port

ONE, TWO = "aa:bb:cc:dd:ee:01", "aa:bb:cc:dd:ee:02"
CLIENT_ONE, CLIENT_TWO = "5b3f4c1e-0000-4000-8000-000000000001", "5b3f4c1e-0000-4000-8000-0002"
REPLICAS, REPLICA_PASSWORD = "esp-mcp-replica", "replica-password-0123456789"
TOKEN = "broker-auth-token-0123456789abcdef"


def test_the_right_logins_pass_and_no_other(tmp_path: Path) -> None:
    credentials = DeviceCredentials(tmp_path)
    clients = {ONE: CLIENT_ONE, TWO: CLIENT_TWO}

    def device(device_id: str, password: str, peer: str | None) -> bool:
        return device_id in clients and credentials.admits(device_id, clients[device_id], password)

    auth = BrokerAuth(TOKEN, REPLICAS, REPLICA_PASSWORD, device)
    one, two = (credentials.password_for(d, clients[d]) for d in (ONE, TWO))
    assert auth.decide(ONE, one, ONE, "10.0.0.7") == ALLOW  # the right device
    assert auth.decide(ONE.upper(), one, ONE.upper(), None) == ALLOW  # as firmware spells it
    wrong = one[:-1] + ("1" if one.endswith("0") else "0")  # differs, whatever its last char
    assert auth.decide(ONE, wrong, ONE, None) == DENY  # a wrong password
    assert auth.decide(ONE, two, ONE, None) == DENY  # another device's password
    assert auth.decide(ONE, one, TWO, None) == DENY  # its password, another's client id
    assert auth.decide(REPLICAS, REPLICA_PASSWORD, "esp-mcp-replica-gw1-abc", None) == ALLOW
    assert auth.decide(REPLICAS, "guess", "esp-mcp-replica-gw1-abc", None) == DENY
    assert auth.decide(REPLICAS, one, REPLICAS, None) == DENY  # a device as the replicas
    assert auth.decide("../#", "x", "../#", None) == DENY  # not a device id
    unset = BrokerAuth(TOKEN, REPLICAS, None, device)  # no replica password: no replica login
    assert unset.decide(REPLICAS, "", "c", None) == DENY
    # Before the replica knows the fleet: the replicas' login decided, a device's left alone.
    joining = BrokerAuth(TOKEN, REPLICAS, REPLICA_PASSWORD, device, knows_fleet=lambda: False)
    assert joining.decide(REPLICAS, REPLICA_PASSWORD, "esp-mcp-replica-gw1-abc", None) == ALLOW
    assert joining.decide(REPLICAS, "guess", "esp-mcp-replica-gw1-abc", None) == DENY
    assert joining.decide(ONE, one, ONE, None) == IGNORE
    assert joining.decide(ONE, one, TWO, None) == DENY  # refused whatever the fleet says


@pytest.mark.anyio
@pytest.mark.e2e
async def test_the_endpoint_checks_logins_for_the_broker(tmp_path: Path) -> None:
    """A replica serves POST /cluster/broker-auth: devices' OTA-derived passwords and the
    replicas' login pass, nothing else; without the token nothing is answered."""
    async with Mosquitto(tmp_path / "broker") as broker:
        options = cluster_options(broker.port, "gw-1", cluster_auth_token=TOKEN,
                                  cluster_username=REPLICAS, cluster_password=REPLICA_PASSWORD,
                                  adoption="auto", mqtt_listen=ListenAddress("127.0.0.1", 0),
                                  mqtt_public_endpoint="127.0.0.1:1883")  # fmt: skip
        # (the replica itself logs in to this mosquitto without a password: it takes any)
        async with gateway(tmp_path / "gw-1", **options) as run, httpx2.AsyncClient() as http:
            base = f"http://127.0.0.1:{run.device_port}"
            passwords = {}
            for device_id, client_id in ((ONE, CLIENT_ONE), (TWO, CLIENT_TWO)):
                reply = await http.post(f"{base}/xiaozhi/ota/", json=_body(device_id),
                                        headers={"Device-Id": device_id,
                                                 "Client-Id": client_id})  # fmt: skip
                assert reply.status_code == 200
                mqtt = reply.json()["mqtt"]
                assert mqtt["username"] == mqtt["client_id"] == device_id
                passwords[device_id] = mqtt["password"]

            async def login(user: str, password: str, client: str, token: str = TOKEN) -> Any:
                body = {"username": user, "password": password, "clientid": client,
                        "peerhost": "10.0.0.7"}  # fmt: skip
                headers = {"Authorization": f"Bearer {token}"}
                response = await http.post(base + PATH, json=body, headers=headers)
                return response.status_code, response.json()

            allow = (200, {"result": "allow", "is_superuser": False})
            deny = (200, {"result": "deny", "is_superuser": False})
            assert await login(ONE, passwords[ONE], ONE) == allow  # the right device
            assert await login(ONE, "0" * 32, ONE) == deny  # a wrong password
            assert await login(ONE, passwords[TWO], ONE) == deny  # another device's password
            assert await login(REPLICAS, REPLICA_PASSWORD, "esp-mcp-replica-gw2-1") == allow
            assert await login(REPLICAS, passwords[ONE], ONE) == deny  # a device as the replicas
            status, _ = await login(ONE, passwords[ONE], ONE, token="wrong-token-0123456789")
            assert status == 401  # no answer to whoever lacks the token
            headers = {"Authorization": f"Bearer {TOKEN}"}
            bad = await http.post(base + PATH, content=b"[1]", headers=headers)
            assert bad.status_code == 400
        # Without [cluster] auth_token there is no such endpoint.
        plain = cluster_options(broker.port, "gw-2")
        async with gateway(tmp_path / "gw-2", **plain) as run, httpx2.AsyncClient() as http:
            response = await http.post(f"http://127.0.0.1:{run.device_port}{PATH}", json={})
            assert response.status_code in (404, 405)


def _body(device_id: str) -> dict[str, Any]:
    return {"version": 2, "mac_address": device_id, "chip_model_name": "esp32s3",
            "application": {"name": "xiaozhi", "version": "2.4.2"},
            "board": {"type": "bread-compact-wifi", "mac": device_id}}  # fmt: skip


@pytest.mark.anyio
@pytest.mark.e2e
async def test_a_replica_answers_before_any_broker_node_accepts_it(tmp_path: Path) -> None:
    """No broker node answers: the replica still answers /healthz (503, joining) and EMQX's
    login checks as soon as it listens; the replicas' login is let in (so that the first
    replica can join), a device's is ignored (refused for now) until it knows the fleet."""
    with refusing_port() as port:
        options = cluster_options(port, "gw-1", cluster_auth_token=TOKEN,
                                  cluster_username=REPLICAS,
                                  cluster_password=REPLICA_PASSWORD)  # fmt: skip
        config = make_config(tmp_path / "gw-1", **options)
        listening: asyncio.Future[Running] = asyncio.get_running_loop().create_future()

        async def serve() -> None:
            async with running(config, on_listening=listening.set_result):
                raise AssertionError("joined a cluster whose broker refuses every connection")

        serving = asyncio.create_task(serve())
        try:
            async with asyncio.timeout(bound(10)):
                run = await asyncio.shield(listening)
            async with asyncio.timeout(bound(2)), httpx2.AsyncClient() as http:
                base = f"http://127.0.0.1:{run.device_port}"
                health = await http.get(f"{base}/healthz")
                assert health.status_code == 503
                assert "gw-1 is joining the cluster" in health.json()["reason"]
                hosts = await http.get(f"http://127.0.0.1:{run.host_port}/healthz")
                assert hosts.status_code == 503

                async def login(user: str, password: str, client: str) -> Any:
                    body = {"username": user, "password": password, "clientid": client}
                    headers = {"Authorization": f"Bearer {TOKEN}"}
                    response = await http.post(base + PATH, json=body, headers=headers)
                    assert response.status_code == 200
                    return response.json()["result"]

                assert await login(REPLICAS, REPLICA_PASSWORD, "esp-mcp-replica-gw-2-1") == ALLOW
                assert await login(REPLICAS, "guess", "esp-mcp-replica-gw-2-1") == DENY
                assert await login(ONE, "0" * 32, ONE) == IGNORE
            assert not serving.done()
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
