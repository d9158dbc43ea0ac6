"""``esp-mcp-gateway doctor``: each misconfiguration users hit is found and comes with its fix."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.doctor import (
    Finding,
    Listener,
    Probes,
    diagnose,
    exposed_probe,
    file_only_config,
    in_container,
    listener_probe,
    tcp_probe,
    writable_probe,
)
from gateway.config import Config, ListenAddress, load_config
from tests.conftest import bound, gateway
from tests.e2e.test_stdio_and_cli import cli, cli_env
from tests.ports import outside_ephemeral, refusing_port

LAN = "http://192.168.1.20:8765"


class FakeNetwork:
    """Probes that answer from tables and remember every address they were asked about."""

    def __init__(
        self,
        listeners: dict[int, Listener] | None = None,
        open_ports: dict[tuple[str, int], str | None] | None = None,
        writable: str | None = None,
    ) -> None:
        self.listeners = listeners or {}
        self.open_ports = open_ports or {}
        self.not_writable = writable
        self.readable_by_others: list[str] = []
        self.asked: list[tuple[str, int]] = []

    def probes(self) -> Probes:
        return Probes(tcp=self.tcp, listener=self.listener, writable=self.writable,
                      exposed=self.exposed, timeout=0.1)  # fmt: skip

    def tcp(self, host: str, port: int, timeout: float) -> str | None:
        self.asked.append((host, port))
        return self.open_ports.get((host, port), "Connection refused")

    def listener(self, host: str, port: int, timeout: float) -> Listener:
        self.asked.append((host, port))
        return self.listeners.get(port, "nothing")

    def writable(self, path: Path) -> str | None:
        return self.not_writable

    def exposed(self, path: Path) -> list[str]:
        return self.readable_by_others


def config(**overrides: Any) -> Config:
    """A sound home-network setup; tests break one thing at a time."""
    values: dict[str, Any] = {
        "data_dir": Path("/var/lib/esp-mcp-gateway"),
        "device_listen": ListenAddress("0.0.0.0", 8765),
        "host_listen": ListenAddress("127.0.0.1", 8766),
        "mqtt_listen": ListenAddress("0.0.0.0", 1883),
        "public_url": LAN,
    }
    values.update(overrides)
    return Config(**values)


def docker(**overrides: Any) -> Config:
    """What the image and deploy/compose.yaml set up."""
    values: dict[str, Any] = {
        "data_dir": Path("/data"),
        "host_listen": ListenAddress("0.0.0.0", 8766),
        "host_token": "a-long-random-host-token-0123456789",
    }
    values.update(overrides)
    return config(**values)


def run(cfg: Config, network: FakeNetwork | None = None, **kwargs: Any) -> list[Finding]:
    return diagnose(cfg, probes=(network or FakeNetwork()).probes(), **kwargs)


def problems(findings: list[Finding]) -> dict[str, Finding]:
    return {f.topic: f for f in findings if f.level == "problem"}


def only(findings: list[Finding], topic: str) -> Finding:
    (found,) = [f for f in findings if f.topic == topic]
    return found


# --- sound setups pass -------------------------------------------------------------------------


def test_a_sound_home_setup_has_no_problems() -> None:
    """Devices on the LAN, MCP on loopback, device URL set: nothing to fix, nothing to warn."""
    findings = run(config())
    assert [f for f in findings if f.level in ("problem", "warning")] == []
    assert {f.topic for f in findings} >= {"device listener", "device URL", "host listener",
                                          "MQTT broker", "data dir"}  # fmt: skip


def test_the_docker_setup_has_no_problems() -> None:
    """The image's environment plus the compose file's token and device URL: all well."""
    running = FakeNetwork(
        listeners={8765: "gateway", 8766: "gateway"}, open_ports={("127.0.0.1", 1883): None}
    )
    findings = run(docker(), running, container=True)
    assert [f for f in findings if f.level in ("problem", "warning")] == []
    assert only(findings, "MQTT broker").level == "ok"


# --- advertised URLs devices cannot reach ------------------------------------------------------


@pytest.mark.parametrize("container", [False, True])
def test_unset_public_url_on_all_interfaces_is_a_warning(container: bool) -> None:
    """Bound to 0.0.0.0 with no device URL, only the OTA endpoint's echo tells devices where."""
    found = only(run(config(public_url=None), container=container), "device URL")
    assert found.level == "warning"
    assert "GATEWAY_DEVICE_URL" in found.fix and ":8765" in found.fix
    assert ("Docker host" in found.fix) is container


def test_unset_public_url_with_a_specific_bind_address_is_fine() -> None:
    findings = run(config(public_url=None, device_listen=ListenAddress("192.168.1.20", 8765)))
    assert only(findings, "device URL").level == "ok"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8765",
        "http://localhost:8765",
        "http://[::1]:8765",
        "ws://192.168.1.20:8765",  # the OTA endpoint wants http(s)
        "http://0.0.0.0:8765",
        "192.168.1.20:8765",  # no scheme
        "http://:8765",
        "http://192.168.1.20:99999",
    ],
)
def test_public_url_devices_cannot_use(url: str) -> None:
    found = problems(run(config(public_url=url)))["device URL"]
    assert "192.168.1.20:8765" in found.fix


def test_public_url_on_another_port_than_the_device_listener() -> None:
    """A wrong port is a problem; in a container it may be a port mapping, so a warning."""
    url = "http://192.168.1.20:9000"
    found = problems(run(config(public_url=url)))["device URL"]
    assert "port 9000" in found.message and "8765" in found.message
    assert found.fix == "use http://192.168.1.20:8765"
    in_docker = only(run(docker(public_url=url), container=True), "device URL")
    assert in_docker.level == "warning" and "-p 9000:8765" in in_docker.fix
    no_port = problems(run(config(public_url="http://192.168.1.20")))["device URL"]
    assert "port 80" in no_port.message


def test_public_url_and_tls() -> None:
    """TLS is a proxy's job: https on the gateway's own plain port cannot work."""
    found = problems(run(config(public_url="https://192.168.1.20:8765")))["device URL"]
    assert "plain HTTP" in found.message
    proxied = only(run(config(public_url="https://gw.example.org")), "device URL")
    assert proxied.level == "ok" and "TLS proxy" in proxied.message


def test_the_device_and_remote_urls_mixed_up() -> None:
    """The common mix-ups of the two URLs (issue 42): a device URL on the MCP port, or on the
    remote URL's tunnel (which carries only the MCP port); a remote URL that is plain http or
    loopback. A sound pair passes; a former setting name is noted with its new one."""
    remote = "https://devices.example.com"
    on_mcp = problems(run(config(public_url="http://192.168.1.20:8766")))["device URL"]
    assert "the MCP port" in on_mcp.message and "port 8765" in on_mcp.fix
    tunnel = only(run(config(public_url=remote, host_public_url=remote)), "device URL")
    assert tunnel.level == "warning" and "carries only the MCP port" in tunnel.message
    assert "192.168.1.20:8765" in tunnel.fix
    plain = problems(run(config(host_public_url="http://devices.example.com")))["remote URL"]
    assert "plain http" in plain.message and "https" in plain.fix
    loopback = problems(run(config(host_public_url="https://127.0.0.1:8766")))["remote URL"]
    assert "loopback" in loopback.message
    sound = run(config(host_public_url=remote))
    assert only(sound, "remote URL").level == "ok" and not problems(sound)
    renamed = ("GATEWAY_PUBLIC_URL is now GATEWAY_DEVICE_URL",)
    note = only(run(config(renamed=renamed)), "settings")
    assert note.level == "info" and "GATEWAY_DEVICE_URL" in note.message


@pytest.mark.parametrize(
    ("url", "words"),
    [("http://gateway.local:8765", ".local"), ("http://192.168.1.20:8765/xiaozhi/v1/", "path")],
)
def test_public_url_warnings(url: str, words: str) -> None:
    found = only(run(config(public_url=url)), "device URL")
    assert found.level == "warning" and words in found.message


# --- listeners bound where they should not be --------------------------------------------------


def test_device_listener_on_loopback() -> None:
    found = problems(run(config(device_listen=ListenAddress("127.0.0.1", 8765))))
    assert found["device listener"].fix.startswith("set GATEWAY_DEVICE_LISTEN=0.0.0.0:8765")
    behind_proxy = config(
        device_listen=ListenAddress("127.0.0.1", 8765), public_url="https://gw.lan"
    )
    assert only(run(behind_proxy), "device listener").level == "warning"


def test_device_listener_on_port_zero() -> None:
    found = problems(run(config(device_listen=ListenAddress("0.0.0.0", 0))))["device listener"]
    assert "port 0" in found.message


def test_host_listener_off_loopback_without_a_token() -> None:
    """What `serve` refuses to start with, said before starting, with how to make a token."""
    found = problems(run(config(host_listen=ListenAddress("0.0.0.0", 8766))))["host listener"]
    assert "no host token" in found.message
    assert "GATEWAY_HOST_TOKEN" in found.fix and "secrets.token_hex" in found.fix
    assert "127.0.0.1:8766" in found.fix


def test_host_listener_on_loopback_in_a_container() -> None:
    """A note, not a problem: right for a dev container, and it says how to serve hosts outside."""
    found = only(run(config(), container=True), "host listener")
    assert found.level == "info" and "GATEWAY_HOST_LISTEN=0.0.0.0:8766" in found.message
    assert only(run(config()), "host listener").level == "ok"


@pytest.mark.parametrize(
    ("files", "env", "expected"),
    [
        ({".dockerenv": ""}, {}, True),
        ({"run/.containerenv": ""}, {}, True),
        ({}, {"container": "podman"}, True),
        ({"proc/1/cgroup": "12:pids:/docker/3f2a\n"}, {}, True),
        ({"proc/1/cgroup": "0::/kubepods/burstable/pod1\n"}, {}, True),
        ({"proc/1/cgroup": "0::/init.scope\n"}, {}, False),
        ({}, {}, False),
    ],
)
def test_container_detection(
    tmp_path: Path, files: dict[str, str], env: dict[str, str], expected: bool
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert in_container(tmp_path, env) is expected


def test_weak_host_tokens() -> None:
    short = only(run(docker(host_token="secret")), "host listener")
    assert short.level == "warning" and "6 characters" in short.message
    shared = docker(host_token="x" * 40, device_tokens=("x" * 40,))
    assert "also a device token" in problems(run(shared))["host listener"].message


def test_listeners_on_the_same_port() -> None:
    cfg = config(host_listen=ListenAddress("127.0.0.1", 8765))
    assert "same port" in problems(run(cfg))["ports"].message
    apart = config(mqtt_listen=ListenAddress("0.0.0.0", 8766), host_listen=ListenAddress("::1", 1))
    assert "ports" not in problems(run(apart))


# --- the running gateway and its broker --------------------------------------------------------


def test_another_program_on_a_listener_port() -> None:
    found = problems(run(config(), FakeNetwork(listeners={8765: "other"})))["device port"]
    assert "another program" in found.message and "GATEWAY_DEVICE_LISTEN" in found.fix


def test_embedded_broker_not_answering_while_the_gateway_runs() -> None:
    network = FakeNetwork(listeners={8765: "gateway", 8766: "gateway"})
    found = problems(run(config(), network))["MQTT broker"]
    assert "does not answer on 0.0.0.0:1883" in found.message
    assert network.asked[-1] == ("127.0.0.1", 1883)  # the configured address, from this machine


def test_port_taken_before_the_embedded_broker_starts() -> None:
    """A mosquitto already on 1883 keeps the embedded broker from starting."""
    network = FakeNetwork(open_ports={("127.0.0.1", 1883): None})
    found = problems(run(config(), network))["MQTT broker"]
    assert "already listens" in found.message and "GATEWAY_MQTT_LISTEN" in found.fix


def test_mqtt_off() -> None:
    network = FakeNetwork()
    findings = run(config(mqtt_listen=None), network)
    assert only(findings, "MQTT broker").level == "info"
    assert ("127.0.0.1", 1883) not in network.asked


def test_external_broker_is_probed_at_its_configured_address_only() -> None:
    cfg = config(mqtt_mode="external", mqtt_host="192.168.1.5", mqtt_port=1884, mqtt_listen=None)
    down = FakeNetwork()
    found = problems(run(cfg, down))["MQTT broker"]
    assert "192.168.1.5:1884" in found.message and "Connection refused" in found.message
    assert [a for a in down.asked if a[1] not in (8765, 8766)] == [("192.168.1.5", 1884)]
    up = FakeNetwork(open_ports={("192.168.1.5", 1884): None})
    assert only(run(cfg, up), "MQTT broker").level == "ok"


@pytest.mark.parametrize(
    ("host", "endpoint", "level"),
    [
        ("localhost", None, "problem"),  # devices would be told to use localhost
        ("mosquitto", None, "warning"),  # a compose service name
        ("mosquitto", "192.168.1.20:1883", "ok"),
        ("mosquitto", "127.0.0.1:1883", "problem"),
        ("broker.lan", None, "ok"),
    ],
)
def test_broker_address_given_to_devices(host: str, endpoint: str | None, level: str) -> None:
    cfg = config(mqtt_mode="external", mqtt_host=host, mqtt_public_endpoint=endpoint)
    found = only(run(cfg), "MQTT endpoint")
    assert found.level == level
    if level != "ok":
        assert "GATEWAY_MQTT_PUBLIC_ENDPOINT" in found.fix


# --- the data dir ------------------------------------------------------------------------------


@pytest.mark.parametrize("container", [False, True])
def test_data_dir_not_writable(container: bool) -> None:
    network = FakeNetwork(writable="cannot create files in /data: Permission denied")
    found = problems(run(docker(), network, container=container))["data dir"]
    assert "Permission denied" in found.message and "chown" in found.fix and "-R" in found.fix
    assert ("docker compose run" in found.fix) is container


@pytest.mark.parametrize("container", [False, True])
def test_a_read_only_data_dir_is_made_writable_not_chowned(container: bool) -> None:
    """No owner helps on a read-only mount: the fix says to mount it read-write (issue 42)."""
    network = FakeNetwork(writable="cannot create files in /data: Read-only file system")
    found = problems(run(docker(), network, container=container))["data dir"]
    assert "chown" not in found.fix and "read-only" in found.fix and "read-write" in found.fix
    assert ("volume" in found.fix) is container


def test_writable_probe(tmp_path: Path) -> None:
    assert writable_probe(tmp_path) is None
    assert writable_probe(tmp_path / "not" / "yet") is None  # created at first start
    (tmp_path / "file").write_text("")
    assert "not a directory" in (writable_probe(tmp_path / "file" / "data") or "")


def test_data_dir_readable_by_others_is_a_warning() -> None:
    """Files others can read are named, with the chmod that fixes them now."""
    network = FakeNetwork()
    assert only(run(docker(), network), "data dir privacy").level == "ok"
    network.readable_by_others = ["/data/audit.log (0644)"]
    found = only(run(docker(), network), "data dir privacy")
    assert found.level == "warning"
    assert "/data/audit.log (0644)" in found.message and "chmod 600" in found.fix


def test_exposed_probe(tmp_path: Path) -> None:
    """The dir and the gateway's files with a group or other bit set; missing files are fine."""
    assert exposed_probe(tmp_path / "not" / "yet") == []
    os.chmod(tmp_path, 0o755)
    (tmp_path / "audit.log").write_text("")
    os.chmod(tmp_path / "audit.log", 0o640)
    (tmp_path / "mqtt_secret").write_text("")
    os.chmod(tmp_path / "mqtt_secret", 0o600)
    assert exposed_probe(tmp_path) == [f"{tmp_path} (0755)", f"{tmp_path / 'audit.log'} (0640)"]


# --- file settings the environment overrides ---------------------------------------------------


def test_file_settings_overridden_by_the_environment(tmp_path: Path) -> None:
    """The image sets listeners by environment: a mounted file setting them again is outvoted."""
    path = tmp_path / "gateway.toml"
    path.write_text('device_listen = "0.0.0.0:9000"\nhost_token = "file-token-0123456789"\n')
    env = {
        "GATEWAY_CONFIG": str(path),
        "GATEWAY_DEVICE_LISTEN": "0.0.0.0:8765",
        "GATEWAY_HOST_TOKEN": "env-token-0123456789",
        "GATEWAY_DATA_DIR": str(tmp_path),
    }
    effective = load_config(env=env)
    file_only = file_only_config(None, env)
    assert file_only is not None
    findings = [f for f in run(effective, file_only=file_only, env=env) if f.topic == "config file"]
    assert [f.level for f in findings] == ["warning", "warning"]
    listen, token = findings
    assert "device_listen = 0.0.0.0:9000" in listen.message
    assert "GATEWAY_DEVICE_LISTEN" in listen.message and "0.0.0.0:8765" in listen.message
    assert "token-0123456789" not in token.message + token.fix  # secrets stay secret
    assert file_only_config(None, {}) is None


def test_settings_the_file_and_environment_agree_on_pass(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('device_listen = "0.0.0.0:8765"\n[calls]\ntimeout = 10\n')
    env = {"GATEWAY_DEVICE_LISTEN": "0.0.0.0:8765", "GATEWAY_DATA_DIR": str(tmp_path)}
    file_only = file_only_config(str(path), env)
    assert file_only is not None
    effective = dataclasses.replace(load_config(path, env=env))
    assert not [f for f in run(effective, file_only=file_only, env=env) if f.topic == "config file"]


# --- the real probes ---------------------------------------------------------------------------


@pytest.fixture
def not_http() -> Iterator[int]:
    """A TCP server that answers anything with bytes that are not HTTP."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(bound(10))

    def answer() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.recv(1024)
            conn.sendall(b"\x20\x02\x00\x00")  # an MQTT CONNACK

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    server.close()
    thread.join(bound(10))


def test_tcp_probe(not_http: int) -> None:
    assert tcp_probe("127.0.0.1", not_http, bound(2)) is None
    with refusing_port() as nothing_there:
        assert tcp_probe("127.0.0.1", nothing_there, bound(2)) is not None


def test_listener_probe_tells_the_gateway_from_nothing_and_others(not_http: int) -> None:
    with refusing_port() as nothing_there:
        assert listener_probe("127.0.0.1", nothing_there, bound(2)) == "nothing"
    assert listener_probe("127.0.0.1", not_http, bound(2)) == "other"


@pytest.mark.anyio
async def test_listener_probe_finds_a_running_gateway(tmp_path: Path) -> None:
    import anyio

    async with gateway(tmp_path) as running:
        state = await anyio.to_thread.run_sync(
            listener_probe, "127.0.0.1", running.device_port, bound(2)
        )
    assert state == "gateway"


# --- the command -------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.e2e
async def test_doctor_command(tmp_path: Path) -> None:
    """`doctor` exits 0 on a sound setup, 1 with each problem and its fix, never a traceback."""
    # doctor probes these and binds none: ports no port-0 binder gets meanwhile (tests/ports.py)
    port = outside_ephemeral()
    sound = cli_env(
        tmp_path,
        GATEWAY_DEVICE_LISTEN=f"0.0.0.0:{port}",
        GATEWAY_HOST_LISTEN=f"0.0.0.0:{outside_ephemeral()}",
        GATEWAY_HOST_TOKEN="a-long-random-host-token-0123456789",
        GATEWAY_PUBLIC_URL=f"http://192.0.2.10:{port}",
    )
    code, out, err = await cli("doctor", env=sound)
    assert (code, err) == (0, ""), out
    assert "no problems found" in out
    broken = {**sound, "GATEWAY_HOST_TOKEN": "", "GATEWAY_PUBLIC_URL": "http://localhost:8765"}
    code, out, err = await cli("doctor", env=broken)
    assert code == 1 and "Traceback" not in out + err
    assert "PROBLEM  host listener" in out and "fix: set GATEWAY_HOST_TOKEN" in out
    assert "PROBLEM  device URL" in out and "2 problem(s)" in out


@pytest.mark.anyio
@pytest.mark.e2e
async def test_doctor_in_a_dev_container_accepts_the_default_host_listener(tmp_path: Path) -> None:
    """Issue 14: `doctor` in a dev container called loopback (the default) a problem, exit 1."""
    env = cli_env(
        tmp_path,
        GATEWAY_DEVICE_LISTEN=f"0.0.0.0:{outside_ephemeral()}",
        GATEWAY_HOST_LISTEN=f"127.0.0.1:{outside_ephemeral()}",  # the default address, free
        container="docker",  # what dev containers and Podman set: the detection sees a container
    )
    code, out, err = await cli("doctor", env=env)
    assert (code, err) == (0, ""), out
    assert "info     host listener" in out and "loopback inside a container" in out
    assert "PROBLEM" not in out
