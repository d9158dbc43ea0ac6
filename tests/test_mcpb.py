"""The Claude Desktop extension: scripts/build-mcpb's bundle, checked as Claude Desktop uses it.

The npm ``@anthropic-ai/mcpb`` CLI (installed by .ci/run into .ci/node) unpacks and validates the
bundle, and its own ``getMcpConfigForManifest`` (what hosts use) turns the manifest and the
user's settings into the command line; the server then runs under uv and answers ``tools/list``
to the MCP SDK's stdio client.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests import programs
from tests.conftest import bound, missing_program, uses_program
from tests.test_icons import png_size

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.e2e


def mcpb_cli() -> Path:
    """The mcpb CLI's script (cli.js): .ci/node's, else one on PATH; skip if there is none."""
    uses_program(programs.MCPB)
    found = programs.mcpb_cli()
    if found is None or shutil.which("node") is None:
        missing_program(programs.MCPB)
    return Path(os.path.realpath(found))


def run(*command: str | Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=bound(120), **kwargs
    )


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built bundle, unpacked by ``mcpb unpack`` as a host does."""
    cli = mcpb_cli()
    where = tmp_path_factory.mktemp("mcpb")
    built = run(sys.executable, ROOT / "scripts" / "build-mcpb", "--output", where / "x.mcpb")
    assert built.returncode == 0, built.stderr
    done = run("node", cli, "unpack", where / "x.mcpb", where / "extension")
    assert done.returncode == 0, done.stdout + done.stderr
    return where / "extension"


def test_the_bundle_validates_with_the_mcpb_cli(unpacked: Path) -> None:
    """`mcpb validate`: the manifest obeys the schema of its manifest_version."""
    done = run("node", mcpb_cli(), "validate", unpacked / "manifest.json")
    assert done.returncode == 0 and "validation passes" in done.stdout, done.stdout + done.stderr
    manifest = json.loads((unpacked / "manifest.json").read_text())
    assert float(manifest["manifest_version"]) >= 0.3
    assert manifest["server"]["type"] in ("uv", "python")
    settings = manifest["user_config"]
    assert settings["host_token"]["sensitive"] is True
    env = manifest["server"]["mcp_config"]["env"]
    assert env == {
        "GATEWAY_DATA_DIR": "${user_config.data_dir}",
        "GATEWAY_PUBLIC_URL": "${user_config.public_url}",
        "GATEWAY_HOST_TOKEN": "${user_config.host_token}",
    }
    assert png_size(unpacked / manifest["icon"]) == (256, 256)  # what Claude Desktop shows
    # The server alone: no board tools in the extension's environment.
    assert "esptool" not in (unpacked / "pyproject.toml").read_text()


def host_config(unpacked: Path, user_config: dict[str, str]) -> dict[str, Any]:
    """The command Claude Desktop would run: mcpb's getMcpConfigForManifest."""
    package = mcpb_cli().parent.parent.parent  # .../@anthropic-ai/mcpb from dist/cli/cli.js
    script = """
        const [lib, dir, userConfig] = process.argv.slice(1);
        const { getMcpConfigForManifest } = await import(lib);
        const fs = await import("node:fs");
        const manifest = JSON.parse(fs.readFileSync(dir + "/manifest.json", "utf8"));
        const config = await getMcpConfigForManifest({
            manifest, extensionPath: dir, systemDirs: { HOME: process.env.HOME },
            userConfig: JSON.parse(userConfig), pathSeparator: "/" });
        console.log(JSON.stringify(config));
    """
    lib = (package / "dist" / "node.js").as_uri()
    done = run("node", "--input-type=module", "-e", script, lib, unpacked, json.dumps(user_config))
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads(done.stdout)
    return config


@pytest.mark.anyio
async def test_the_bundle_starts_under_uv_and_lists_tools(unpacked: Path, tmp_path: Path) -> None:
    """With the user's settings substituted, the server answers tools/list over stdio."""
    data = tmp_path / "data"
    config = host_config(unpacked, {"data_dir": str(data), "host_token": "desktop-secret-token",
                                    "public_url": "http://192.0.2.7:8765"})  # fmt: skip
    assert config["command"] == "uv" and config["env"]["GATEWAY_DATA_DIR"] == str(data)
    uv = Path(sys.executable).parent / "uv"  # the dev extra's uv; Claude Desktop brings its own
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
        "PATH": f"{uv.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        # The machine's CAs, as pip uses them (a registry behind a TLS-inspecting proxy).
        "UV_NATIVE_TLS": os.environ.get("UV_NATIVE_TLS", "1"),
        **config["env"],
        # Not the defaults 8765/8766 (other tests and gateways may hold them): port 0.
        "GATEWAY_DEVICE_LISTEN": "127.0.0.1:0",
        "GATEWAY_HOST_LISTEN": "127.0.0.1:0",
        "GATEWAY_MQTT_LISTEN": "off",
    }
    params = StdioServerParameters(command=str(uv), args=config["args"], env=env)
    with anyio.fail_after(bound(180)):  # the first start installs the dependencies
        async with Client(params, mode="legacy") as client:
            assert client.server_info.name == "esp-mcp-gateway"
            names = [t.name for t in (await client.list_tools()).tools]
    assert names == ["list_devices", "call_device_tool", "wait_for_event", "notify_device"]
    assert data.is_dir()  # the data dir setting reached the gateway
