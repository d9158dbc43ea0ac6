"""doctor asks each voice server the configuration names if it answers (a GET, no check-in)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from gateway.cli.doctor import Probes, diagnose
from gateway.config import Config, DeviceOptions, ListenAddress
from tests.upstream_server import UpstreamServer

pytestmark = pytest.mark.anyio


def setup(**upstream: object) -> Config:
    return Config(
        data_dir=Path("/var/lib/esp-mcp-gateway"),
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
