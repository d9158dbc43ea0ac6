"""`stdio --connect`, the relay Claude Desktop runs, driven by a real SDK stdio client (issue 14).

Each test runs ``python -m gateway stdio --connect URL`` as a subprocess against a real gateway
(or a port where none listens) and checks what the host and the user see.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_types.version import LATEST_MODERN_VERSION

from gateway.host_side.relay import RELAY_ERROR
from tests.conftest import bound, gateway
from tests.e2e.helpers import listed_device
from tests.e2e.test_stdio_and_cli import cli_env

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

HOST_TOKEN = "host-token-long-enough-for-tests"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}


def relay(url: str, tmp_path: Path, *token: str) -> StdioServerParameters:
    args = ["-m", "gateway", "stdio", "--connect", url, *(("--token", *token) if token else ())]
    return StdioServerParameters(command=sys.executable, args=args, env=cli_env(tmp_path))


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


async def refused(params: StdioServerParameters, errlog: Path) -> tuple[MCPError, str]:
    """Connect as a host would; return the MCP error it gets and the relay's stderr."""
    with errlog.open("w") as err, pytest.raises(BaseException) as caught:  # noqa: PT011
        with anyio.fail_after(bound(20)):
            async with Client(stdio_client(params, errlog=err)):
                pass
    errors = [e for e in leaves(caught.value) if isinstance(e, MCPError)]
    assert errors, f"no MCP error: {caught.value!r}"
    return errors[0], await anyio.Path(errlog).read_text()


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


async def test_the_relay_speaks_the_newest_era_like_plain_stdio(tmp_path: Path) -> None:
    """A host that can speak 2026-07-28 gets it through the relay, calls and pushes included."""
    async with gateway(tmp_path / "gw", host_token=HOST_TOKEN) as run:
        params = relay(run.mcp_url, tmp_path / "relay", HOST_TOKEN)
        async with Client(params) as client:
            assert client.protocol_version == LATEST_MODERN_VERSION
            async with client.listen(tools_list_changed=True) as changes:
                async with listed_device(run):
                    with anyio.fail_after(bound(10)):
                        await anext(aiter(changes))
                    result = await client.call_tool("sim-esp32_0001_lamp_turn_on", {})
    assert not result.is_error and result.content[0].text == "true"


@pytest.mark.parametrize("token", [("wrong-token",), ()], ids=["wrong token", "no token"])
async def test_a_refused_host_token_is_a_clear_mcp_error_and_one_line(
    tmp_path: Path, token: tuple[str, ...]
) -> None:
    """Not "-32603 Server returned an error response": what is wrong and what to do."""
    async with gateway(tmp_path / "gw", host_token=HOST_TOKEN) as run:
        error, stderr = await refused(relay(run.mcp_url, tmp_path / "relay", *token),
                                      tmp_path / "stderr")  # fmt: skip
    assert error.code == RELAY_ERROR
    assert "host token (HTTP 401)" in error.message and "--token" in error.message
    assert ("refused" if token else "wants") in error.message
    assert error.message in one_line(stderr)


async def test_an_unreachable_gateway_is_a_clear_mcp_error_and_one_line(
    tmp_path: Path, refused_port: int
) -> None:
    """Not a 105-line ExceptionGroup: the URL and why it cannot be reached."""
    url = f"http://127.0.0.1:{refused_port}/mcp"
    error, stderr = await refused(relay(url, tmp_path, HOST_TOKEN), tmp_path / "stderr")
    assert error.code == RELAY_ERROR
    assert error.message == f"cannot reach the gateway at {url}: connection refused"
    assert error.message in one_line(stderr)


@pytest.mark.parametrize("where", ["gateway", "wrong token", "nothing"])
async def test_the_relay_exits_when_stdin_closes(
    tmp_path: Path, where: str, refused_port: int
) -> None:
    """Like plain `stdio`: the host closing stdin ends the relay at once, status 0."""
    async with gateway(tmp_path / "gw", host_token=HOST_TOKEN) as run:
        url = run.mcp_url if where != "nothing" else f"http://127.0.0.1:{refused_port}/mcp"
        token = HOST_TOKEN if where == "gateway" else "wrong-token"
        args = ["stdio", "--connect", url, "--token", token]
        process = await anyio.open_process(
            [sys.executable, "-m", "gateway", *args], env=cli_env(tmp_path / "relay")
        )
        async with process:
            assert process.stdin is not None and process.stdout is not None
            await process.stdin.send(json.dumps(INITIALIZE).encode() + b"\n")
            with anyio.fail_after(bound(20)):
                answer = json.loads(await process.stdout.receive())
            assert answer["id"] == 1 and ("result" in answer) == (where == "gateway")
            await process.stdin.aclose()
            with anyio.fail_after(bound(5)):
                assert await process.wait() == 0
