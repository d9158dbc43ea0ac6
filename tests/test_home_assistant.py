"""The Home Assistant add-on repository: the layout the Supervisor reads, config.yaml valid by
the rules it applies (tests/vectors/home-assistant), and the add-on's options reaching the
gateway's settings through its entry point (home-assistant/esp_mcp_gateway/run.py)."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx2
import jsonschema
import pytest
import yaml

from gateway import __version__
from gateway.app import running
from gateway.config import ListenAddress, load_config
from gateway.config.keys import FIELDS, env_name
from tests.conftest import bound
from tests.device_side.test_ota import STOCK_BODY, STOCK_HEADERS

ROOT = Path(__file__).resolve().parent.parent
ADDON = ROOT / "home-assistant" / "esp_mcp_gateway"
SCHEMA = json.loads((ROOT / "tests/vectors/home-assistant/addon-config.schema.json").read_text())
IMAGE = "ghcr.io/esp-mcp-gateway/esp-mcp-gateway"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def run_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ha_run", ADDON / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIG = load(ADDON / "config.yaml")
RUN = run_module()


def errors(config: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(config)]


def test_the_repository_has_what_the_add_on_store_reads() -> None:
    """repository.yaml at the root; the add-on's folder with its config, docs, translations,
    icon, logo and Dockerfile."""
    repository = load(ROOT / "repository.yaml")
    assert {"name", "url", "maintainer"} <= set(repository)
    for name in ("config.yaml", "build.yaml", "Dockerfile", "run.py", "DOCS.md", "README.md",
                 "translations/en.yaml", "icon.png", "logo.png", "CHANGELOG.md",
                 "apparmor.txt"):  # fmt: skip
        assert (ADDON / name).is_file(), name
    # The Supervisor finds add-ons by their config file: this must be the repository's only one.
    found = [p for p in ROOT.rglob("config.y*ml") if ".venv" not in p.parts and "node_modules"
             not in p.parts and ".ci" not in p.parts]  # fmt: skip
    assert found == [ADDON / "config.yaml"]


def test_config_is_valid_by_the_supervisor_s_rules() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert errors(CONFIG) == []


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"arch": ["x86"]}, "'x86' is not one of"),
        ({"ports": {"8765/tcp": 70000}}, "is not valid under any of the given schemas"),
        ({"ports": {"8765/sctp": 8765}}, "does not match"),
        ({"schema": {"host_token": "passwd"}}, "is not valid under any of the given schemas"),
        ({"startup": "later"}, "'later' is not one of"),
        ({"slug": "esp mcp"}, "does not match"),
        ({"hostnetwork": True}, "Additional properties are not allowed"),
    ],
)
def test_the_schema_refuses_what_the_supervisor_refuses(
    change: dict[str, Any], complaint: str
) -> None:
    found = errors({**CONFIG, **change})
    assert any(complaint in e for e in found), found


def test_options_schema_translations_and_entry_point_agree() -> None:
    """Every option has a schema entry, a translation and a GATEWAY_* variable; every port has
    a description and a translation, and is one the image exposes."""
    schema, options = CONFIG["schema"], CONFIG["options"]
    # Required options have defaults; optional ones start unset (an empty url would not pass).
    assert set(options) == {key for key, kind in schema.items() if not kind.endswith("?")}
    assert set(schema) == set(RUN.ENVIRONMENT) | set(RUN.FORMER_OPTIONS)
    translations = load(ADDON / "translations/en.yaml")
    assert set(translations["configuration"]) == set(schema)
    assert set(translations["network"]) == set(CONFIG["ports"]) == set(CONFIG["ports_description"])
    exposed = re.search(r"^EXPOSE (.+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert exposed is not None
    assert {f"{port}/tcp" for port in exposed.group(1).split()} == set(CONFIG["ports"])
    assert CONFIG["ingress_port"] == 8766 == RUN.HOST_PORT  # the dashboard: the host listener


def test_every_variable_is_a_gateway_setting() -> None:
    """Every variable the add-on sets is one the gateway reads (the voice server's one too)."""
    known = {env_name(table, key) for table, key, _, _ in FIELDS}
    assert "GATEWAY_UPSTREAM_OTA_URL" in set(RUN.ENVIRONMENT.values())
    assert set(RUN.ENVIRONMENT.values()) | set(RUN.HOME_ASSISTANT) <= known


def test_the_add_on_is_built_on_the_gateway_s_image_of_its_version() -> None:
    assert CONFIG["version"] == __version__
    build = load(ADDON / "build.yaml")
    assert set(build["build_from"]) == set(CONFIG["arch"])
    assert set(build["build_from"].values()) == {f"{IMAGE}:{__version__}"}
    dockerfile = (ADDON / "Dockerfile").read_text()
    assert f"ARG BUILD_FROM={IMAGE}:{__version__}" in dockerfile


def test_options_become_the_gateway_s_settings() -> None:
    """What a user sets on the Configuration tab is what the gateway runs with."""
    options = {"host_token": "a-host-token-of-32-characters-xx", "device_url":
               "http://192.168.1.20:8765", "mqtt_mode": "external", "mqtt_host": "core-mosquitto",
               "mqtt_port": 1883, "mqtt_username": "gateway", "mqtt_password": "secret",
               "mqtt_public_endpoint": "", "log_level": "debug"}  # fmt: skip
    env = RUN.environment(options)
    config = load_config(env=env)
    assert config.host_token == options["host_token"]
    assert config.public_url == "http://192.168.1.20:8765"
    assert (config.mqtt_mode, config.mqtt_host, config.mqtt_port) == (
        "external",
        "core-mosquitto",
        1883,
    )
    assert (config.mqtt_username, config.mqtt_password) == ("gateway", "secret")
    assert config.mqtt_listen is None and config.log_level == "debug"
    assert "GATEWAY_MQTT_PUBLIC_ENDPOINT" not in env  # empty: the gateway's default
    assert config.host_ingress_peers == ("172.30.32.2",)  # the Supervisor's ingress, no other
    assert config.oauth_http_networks == ("172.30.32.0/23",)  # HA's MCP client gets tokens
    assert RUN.mcp_url(options) == "http://192.168.1.20:8766/mcp"
    embedded = load_config(env=RUN.environment({**CONFIG["options"], "host_token": "x" * 32,
                                                "mqtt_mode": "embedded"}))  # fmt: skip
    assert embedded.mqtt_listen == ListenAddress("0.0.0.0", 1883)  # the image's, kept


def test_the_former_device_url_option_still_works_and_says_the_new_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``public_url`` (the device URL's former name) is read as ``device_url``, said once."""
    options = RUN.current_names({"host_token": "x" * 32, "public_url": "http://192.168.1.20:8765"})
    config = load_config(env=RUN.environment(options))
    assert config.public_url == "http://192.168.1.20:8765"
    [line] = capsys.readouterr().err.splitlines()
    assert "option public_url is now device_url" in line
    assert RUN.mcp_url(options) == "http://192.168.1.20:8766/mcp"


@pytest.mark.anyio
async def test_the_add_on_with_remote_access_issues_for_the_remote_url_and_keeps_boards_local(
    tmp_path: Path,
) -> None:
    """The add-on's remote-access options, through run.py, in a running gateway: the OAuth
    issuer is the remote URL over https, the Host it names is let in, and boards are still
    told the device URL (a tunnel carries only the MCP port)."""
    options = {**CONFIG["options"], "host_token": "a-host-token-of-32-characters-xx",
               "device_url": "http://192.168.1.20:8765", "remote_url": "https://devices.example.com",
               "http_networks": "192.168.1.0/24"}  # fmt: skip
    config = load_config(env={**RUN.environment(options), "GATEWAY_DATA_DIR": str(tmp_path),
                              "GATEWAY_DEVICE_LISTEN": "127.0.0.1:0",
                              "GATEWAY_HOST_LISTEN": "127.0.0.1:0"})  # fmt: skip
    assert config.oauth_http_networks == ("172.30.32.0/23", "192.168.1.0/24")  # HA's kept
    bearer = {"Authorization": f"Bearer {options['host_token']}"}
    async with running(config) as run, httpx2.AsyncClient(timeout=bound(10)) as http:
        host = f"http://127.0.0.1:{run.host_port}"
        issuer = await http.get(f"{host}/.well-known/oauth-authorization-server",
                                headers={"Host": "devices.example.com"})  # fmt: skip
        setup = await http.get(f"{host}/api/setup", headers=bearer)
        ota = await http.post(f"http://127.0.0.1:{run.device_port}/xiaozhi/ota/",
                              headers=STOCK_HEADERS, json=STOCK_BODY)  # fmt: skip
    assert issuer.status_code == 200 and issuer.json()["issuer"] == "https://devices.example.com"
    # DOCS.md: HA 2026.11 signs in without PKCE, so it cannot use the add-on; the next HA can
    assert issuer.json()["code_challenge_methods_supported"] == ["S256"]
    assert setup.json()["websocket_url"] == "ws://192.168.1.20:8765/xiaozhi/v1/"
    assert setup.json()["ota_url"] == "http://192.168.1.20:8765/xiaozhi/ota/"
    assert ota.json()["websocket"]["url"] == "ws://192.168.1.20:8765/xiaozhi/v1/"


def test_the_defaults_refuse_to_start_without_a_host_token() -> None:
    with pytest.raises(RUN.OptionsError, match="set host_token on the add-on's Configuration"):
        RUN.environment(CONFIG["options"])
    with pytest.raises(RUN.OptionsError, match="unknown option"):
        RUN.environment({**CONFIG["options"], "host_token": "x" * 32, "colour": "blue"})
    assert RUN.mcp_url(CONFIG["options"]) == "http://<Home Assistant address>:8766/mcp"


@pytest.mark.skipif(os.getuid() != 0, reason="chown needs root (CI runs as root)")
def test_the_data_dir_becomes_the_gateway_user_s(tmp_path: Path) -> None:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_bytes(b"x")
    (tmp_path / "options.json").write_text("{}")
    RUN.own_data_dir(tmp_path, 10001)
    assert {p.stat().st_uid for p in [tmp_path, *tmp_path.glob("**/*")]
            if p.name != "options.json"} == {10001}  # fmt: skip
    assert (tmp_path / "options.json").stat().st_uid == 0


def test_the_add_on_installs_the_image_the_release_publishes() -> None:
    """``image:`` (HA's way for prebuilt images): the multi-arch manifest the release workflow
    pushes, built from this folder for every arch the add-on lists, tagged with its version."""
    workflow = load(ROOT / ".github/workflows/release.yml")
    owner = CONFIG["image"].split("/")[1]
    pushed = workflow["env"]["ADDON_IMAGE"].replace("${{ github.repository_owner }}", owner)
    assert CONFIG["image"] == pushed == f"{IMAGE}-addon" and "{arch}" not in CONFIG["image"]
    [step] = [s for s in workflow["jobs"]["images"]["steps"]
              if s.get("with", {}).get("context") == "home-assistant/esp_mcp_gateway"]  # fmt: skip
    platforms = {p.removeprefix("linux/") for p in step["with"]["platforms"].split(",")}
    assert {"amd64": "amd64", "arm64": "aarch64"}.keys() == platforms
    assert set(CONFIG["arch"]) == {"amd64", "aarch64"}
    assert step["with"]["tags"] == "${{ env.ADDON_IMAGE }}:${{ needs.version.outputs.version }}"
    assert "BUILD_FROM=${{ env.IMAGE }}:" in step["with"]["build-args"]


def test_the_add_on_s_changelog_apparmor_and_watchdog() -> None:
    """HA shows CHANGELOG.md on update: its newest entry is this version. The AppArmor profile
    is named after the slug; the watchdog polls /healthz on the host listener."""
    changelog = (ADDON / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\S+)", changelog, re.M)
    assert newest is not None and newest.group(1) == __version__ == CONFIG["version"]
    apparmor = (ADDON / "apparmor.txt").read_text()
    assert re.search(rf"^profile {CONFIG['slug']} flags=", apparmor, re.M)
    assert "/data/** rwk" in apparmor and "capability setuid" in apparmor
    assert CONFIG["watchdog"] == f"http://[HOST]:[PORT:{RUN.HOST_PORT}]/healthz"
    assert CONFIG["services"] == ["mqtt:want"]


@pytest.fixture
def supervisor() -> Iterator[tuple[str, list[str]]]:
    """The Supervisor's services API on loopback: /services/mqtt as the Mosquitto add-on
    provides it (/none: no provider). Yields its URL and the tokens it was sent."""
    tokens: list[str] = []

    class Supervisor(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            tokens.append(self.headers.get("Authorization", ""))
            if self.path != "/services/mqtt":
                self.send_error(400)
                return
            body = json.dumps({"result": "ok", "data": {
                "host": "core-mosquitto", "port": 1883, "ssl": False, "protocol": "3.1.1",
                "username": "addons", "password": "from-the-supervisor"}}).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Supervisor)  # port 0: it says which
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tokens
    finally:
        server.shutdown()
        server.server_close()


def test_external_mqtt_without_a_host_takes_home_assistant_s_broker(
    supervisor: tuple[str, list[str]],
) -> None:
    """mqtt_mode external, mqtt_host empty: broker and login come from the Supervisor."""
    url, tokens = supervisor
    options = {"host_token": "x" * 32, "mqtt_mode": "external", "log_level": "info"}
    assert RUN.wants_supervisor_mqtt(options)
    env = RUN.environment(options)
    env.update(RUN.supervisor_mqtt(RUN.ask_supervisor(f"{url}/services/mqtt", "sup-token")))
    config = load_config(env=env)
    assert (config.mqtt_mode, config.mqtt_host, config.mqtt_port) == (
        "external", "core-mosquitto", 1883)  # fmt: skip
    assert (config.mqtt_username, config.mqtt_password) == ("addons", "from-the-supervisor")
    assert tokens == ["Bearer sup-token"]
    assert not RUN.wants_supervisor_mqtt({**options, "mqtt_host": "10.0.0.5"})  # typed: kept


def test_without_a_broker_add_on_it_says_what_to_install(
    supervisor: tuple[str, list[str]],
) -> None:
    url, _ = supervisor
    with pytest.raises(RUN.OptionsError, match="install the Mosquitto broker add-on"):
        RUN.supervisor_mqtt(RUN.ask_supervisor(f"{url}/none", "sup-token"))


DOCS = {
    name: path.read_text(encoding="utf-8")
    for name, path in (
        ("DOCS.md", ADDON / "DOCS.md"),
        ("docs/home-assistant.md", ROOT / "docs/home-assistant.md"),
    )
}
# What the add-on's docs once said and the code no longer does (issue 42).
NO_LONGER = [
    r"cannot use this add-on yet",  # HA's MCP integration can, from the release after 2026.11
    r"first time, it asks for the host token|dashboard asks for it once",  # ingress signs in
    r"password made for the gateway in Mosquitto",  # mqtt:want fills the login in
    r"public_url` \| `GATEWAY_PUBLIC_URL",  # the device URL's former name
]


def options_table(text: str) -> dict[str, str]:
    """docs/home-assistant.md's options table: option -> the gateway setting its row names."""
    rows = re.findall(r"^\| (`[a-z_]+`.*?) \| `(GATEWAY_[A-Z_*]+)` \|", text, re.M)
    return {option: env for cell, env in rows for option in re.findall(r"`([a-z_]+)`", cell)}


def test_the_add_on_s_docs_agree_with_its_code() -> None:
    """DOCS.md (the Documentation tab) and docs/home-assistant.md agree with config.yaml,
    run.py and the translations: every option documented under its name and setting, the ports,
    the MCP URL on the add-on's port, the Home Assistant versions, nothing the code stopped
    doing."""
    translations = load(ADDON / "translations/en.yaml")["configuration"]
    table = options_table(DOCS["docs/home-assistant.md"])
    current = set(CONFIG["schema"]) - set(RUN.FORMER_OPTIONS)
    assert set(table) == current
    for option, env in table.items():
        assert re.fullmatch(env.replace("*", ".*"), RUN.ENVIRONMENT[option]), option
    for option in CONFIG["schema"]:
        assert f"**{translations[option]['name']}**" in DOCS["DOCS.md"], option
    version = ".".join(CONFIG["homeassistant"].split(".")[:2])  # the oldest HA it installs on
    for name, text in DOCS.items():
        assert f":{RUN.HOST_PORT}/mcp" in text and ":8123/mcp" not in text, name
        assert all(f"{port.split('/')[0]}" in text for port in ("8765/tcp", "8766/tcp")), name
        assert "mqtt:want" in text and version in text, name
        for claim in NO_LONGER:
            assert not re.search(claim, text, re.I | re.S), (name, claim)
    said = json.dumps(translations)
    assert "core-mosquitto, port 1883, and its user" not in said, "the login is filled in"
    assert not re.search(NO_LONGER[1], said), "the sidebar signs the user in"


def test_the_add_on_s_claude_desktop_entry_is_the_dashboard_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """DOCS.md's Claude Desktop config is what the add-on's Setup page gives (in its container,
    for Home Assistant's name), so pasting either works the same."""
    from gateway.host_side.dashboard import host_configs

    monkeypatch.setattr(host_configs, "in_container", lambda: True)
    given = host_configs.host_configs("http://homeassistant.local:8766/mcp", True, tmp_path)
    [block] = re.findall(r"^```json\n(.*?)^```", DOCS["DOCS.md"], re.M | re.S)
    assert json.loads(block) == json.loads(given["claude_desktop"])
