"""doctor asks each voice server the configuration names if it answers (a GET, no check-in),
and reaches the MQTT broker kept for each MQTT device's server (no login), on a real mosquitto."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import anyio
import pytest

from gateway.cli.doctor import Finding, Probes, diagnose
from gateway.cli.doctor.probes import tls_probe
from gateway.config import Config, DeviceOptions, ListenAddress
from gateway.device_side.upstream.mqtt_settings import MqttUpstreams
from tests.mqtt_helpers import Mosquitto
from tests.ports import refusing_port
from tests.upstream_server import UpstreamServer

pytestmark = pytest.mark.anyio


def setup(data_dir: Path = Path("/var/lib/esp-mcp-gateway"), **upstream: object) -> Config:
    return Config(
        data_dir=data_dir,
        device_listen=ListenAddress("0.0.0.0", 8765),
        mqtt_listen=None,
        public_url="http://192.168.1.20:8765",
        **upstream,  # type: ignore[arg-type]
    )


async def test_a_voice_server_that_answers_and_one_that_does_not() -> None:
    upstream = UpstreamServer()
    async with upstream.running():
        gone = "http://127.0.0.1:9/xiaozhi/ota/"
        devices = {"aa:bb:cc:dd:ee:01": DeviceOptions(upstream=gone),
                   "aa:bb:cc:dd:ee:02": DeviceOptions(upstream=None)}  # fmt: skip
        config = setup(upstream_ota_url=upstream.ota_url, devices=devices)
        findings = await anyio.to_thread.run_sync(lambda: diagnose(config, probes=Probes()))
    found = {f.message.split(" answers")[0].split(" does not")[0]: f for f in findings
             if f.topic == "voice servers"}  # fmt: skip
    assert found[f"the voice server at {upstream.ota_url}"].level == "ok"
    assert "HTTP 400" in found[f"the voice server at {upstream.ota_url}"].message
    problem = found[f"the voice server at {gone}"]
    assert problem.level == "problem" and "[upstream] ota_url" in problem.fix
    assert upstream.ota_requests and all(not body for _, body in upstream.ota_requests)


def test_without_a_voice_server_nothing_is_asked() -> None:
    def never(url: str, timeout: float) -> str:
        raise AssertionError(url)

    findings = diagnose(setup(), probes=Probes(upstream=never, tcp=lambda *a: "refused",
                                                 listener=lambda *a: "nothing"))  # fmt: skip
    assert not [f for f in findings if f.topic == "voice servers"]


def keep_broker(data_dir: Path, device_id: str, endpoint: str) -> None:
    """What the OTA proxy keeps when ``device_id``'s server told it to use ``endpoint``."""
    MqttUpstreams(data_dir).keep(device_id, {
        "endpoint": endpoint, "client_id": f"GID_test@@@{device_id}", "username": "u",
        "password": "p", "publish_topic": "device-server", "subscribe_topic": "null",
    })  # fmt: skip


async def brokers(config: Config, probes: Probes) -> list[Finding]:
    findings = await anyio.to_thread.run_sync(lambda: diagnose(config, probes=probes))
    return [f for f in findings if f.topic == "voice servers" and "MQTT broker" in f.message]


async def test_the_upstream_brokers_of_mqtt_devices_are_reached_without_a_login(
    tmp_path: Path,
) -> None:
    with refusing_port() as nothing_there:  # bound, not listening: refused
        async with Mosquitto(tmp_path / "broker", users={"u": "p"}) as broker:
            keep_broker(tmp_path, "aa:bb:cc:dd:ee:01", f"127.0.0.1:{broker.port}")
            keep_broker(tmp_path, "aa:bb:cc:dd:ee:02", f"127.0.0.1:{broker.port}")
            keep_broker(tmp_path, "aa:bb:cc:dd:ee:03", f"127.0.0.1:{nothing_there}")
            found = await brokers(setup(tmp_path, upstream_ota_url="http://127.0.0.1:9/"), Probes())
            [up] = [f for f in found if f"127.0.0.1:{broker.port} " in f.message]
            [down] = [f for f in found if f is not up]
            await broker.stop()  # its log complete: it saw the probe's connection, and no login
        assert up.level == "ok" and f"mqtt://127.0.0.1:{broker.port}" in up.message
        assert "aa:bb:cc:dd:ee:01, aa:bb:cc:dd:ee:02 can be reached (TCP)" in up.message
        assert down.level == "problem" and "aa:bb:cc:dd:ee:03 cannot be reached" in down.message
        assert "refused" in down.message.lower() and "restart the device" in down.fix
        assert any("New connection from 127.0.0.1" in line for line in broker.log)
        assert not any("New client connected" in line for line in broker.log)


def port_8883_free() -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", 8883))
        except OSError:
            return False
    return True


async def test_a_tls_broker_on_8883_gets_a_handshake(tmp_path: Path) -> None:
    """Port 8883 means TLS (stock firmware's rule): the handshake is made and verified."""
    if not port_8883_free():
        pytest.skip("port 8883 is taken on this machine")
    broker = Mosquitto(tmp_path / "broker", users={"u": "p"}, tls=True)
    broker.port = 8883
    async with broker:
        keep_broker(tmp_path, "aa:bb:cc:dd:ee:01", "127.0.0.1")  # no port: 8883, TLS
        config = setup(tmp_path, upstream_ota_url="http://127.0.0.1:9/")
        ours = ssl.create_default_context(cafile=broker.cert)

        def trusting(host: str, port: int, tls: bool, timeout: float) -> str | None:
            return tls_probe(host, port, timeout, ours if tls else None)  # as with the CA added

        [trusted] = await brokers(config, Probes(broker=trusting))
        [untrusted] = await brokers(config, Probes())  # its self-signed cert is in no system CA
    assert trusted.level == "ok" and "mqtts://127.0.0.1:8883" in trusted.message
    assert "(TLS handshake done)" in trusted.message
    assert untrusted.level == "problem" and "TLS handshake failed" in untrusted.message
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.message
