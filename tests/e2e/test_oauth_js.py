"""OAuth end to end with JavaScript clients nobody here wrote, against a real gateway.

- The TypeScript MCP SDK's OAuth client (tests/e2e/ts_oauth_client.mjs: its
  StreamableHTTPClientTransport with an OAuthClientProvider) discovers the gateway, registers,
  sends the owner to the real consent page (headless Chromium answers it), lists tools and calls
  one on a simulated device; Revoke on the dashboard makes its next call a 401.
- mcp-remote, started with no token by an MCP SDK client over stdio, runs the whole sign-in
  itself. It opens the browser through the ``open`` package, whose bundled xdg-open (with no
  desktop to ask) runs ``$BROWSER``: ours hands the URL to Chromium. After Revoke its next call
  does not reach the device: it opens the consent page again.

Both packages come from npm into .ci/node (tests/programs.py); everything runs on loopback.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client, MCPError, StdioServerParameters
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

from gateway.app import Running
from tests import programs
from tests.conftest import asgi_server, bound, missing_program, uses_program
from tests.e2e.helpers import listed_device
from tests.e2e.test_oauth import ADMIN, SIM, VOLUME, audit_records, signed_in_dashboard
from tests.oauth_helpers import (
    ConsentBrowser,
    base_url,
    callback_server,
    consent_browser,
    oauth_gateway,
)

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

TS_CLIENT = Path(__file__).with_name("ts_oauth_client.mjs")


def npm_package(name: str) -> Path:
    """The pinned npm package ``name`` in .ci/node; skip, saying how to install it, if absent
    (or node is: it comes with npm, which installed the package)."""
    uses_program(name)
    folder = programs.npm_package(name)
    if folder is None or shutil.which("node") is None:
        missing_program(name)
    return folder


def node() -> str:
    """The node that runs the npm packages (npm_package() checked it is there)."""
    found = shutil.which("node")
    assert found is not None
    return found


@dataclass
class NodeApp:
    """The TypeScript SDK app: commands go to its stdin, what it says is read line by line."""

    process: Process
    log: Path
    heard: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        assert self.process.stdout is not None
        self._lines = BufferedByteReceiveStream(self.process.stdout)

    async def tell(self, **command: Any) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(f"{json.dumps(command)}\n".encode())

    async def expect(self, key: str) -> Any:
        """The value of the next message that has ``key`` (what came between is kept)."""
        with anyio.fail_after(bound(30)):
            while True:
                try:
                    line = await self._lines.receive_until(b"\n", 1 << 20)
                except anyio.EndOfStream:
                    raise AssertionError(f"the app exited: {self.log.read_text()}") from None
                message = json.loads(line)
                self.heard.append(message)
                if key in message:
                    return message[key]

    def said(self, key: str) -> list[Any]:
        """Every value of ``key`` the app has said so far."""
        return [message[key] for message in self.heard if key in message]


@asynccontextmanager
async def ts_app(run: Running, redirect: str, name: str, log: Path) -> AsyncIterator[NodeApp]:
    """The TypeScript SDK app for ``run``'s /mcp; its stderr goes to ``log``."""
    sdk = npm_package("@modelcontextprotocol/sdk")
    modules = sdk.parent.parent  # .ci/node/node_modules from .../@modelcontextprotocol/sdk
    command = [node(), str(TS_CLIENT), str(modules), run.mcp_url, redirect, name]
    with log.open("wb") as errors:
        async with await anyio.open_process(command, stderr=errors) as process:
            try:
                yield NodeApp(process, log)
            finally:
                assert process.stdin is not None
                await process.stdin.aclose()  # the app closes its client and exits
                with anyio.move_on_after(bound(10)):
                    await process.wait()
                if process.returncode is None:
                    process.kill()


async def revoke_in_dashboard(owner: ConsentBrowser, run: Running, client_id: str) -> None:
    """The owner presses Revoke on the app's row of Connected apps."""
    page = await signed_in_dashboard(owner, run, "#apps")
    await page.locator(f'#apps tr[data-client="{client_id}"] button.revoke').click()
    await page.wait_for_selector("#apps-empty:not([hidden])")


async def test_typescript_sdk_registers_gets_consent_calls_a_tool_and_is_revoked(
    tmp_path: Path,
) -> None:
    """The TS SDK finds the authorization server from the 401, registers, gets the owner's
    Allow in Chromium, calls a tool that reaches the device; after Revoke its next call is
    refused with 401 and the SDK sends the owner back to consent."""
    async with (
        oauth_gateway(tmp_path / "data") as run,
        listed_device(run, SIM) as dev,
        callback_server() as callback,
        consent_browser() as owner,
        ts_app(run, callback.url, "TypeScript app", tmp_path / "node.log") as app,
    ):
        first_401 = (await app.expect("www_authenticate")) or ""
        authorize = await app.expect("authorize")
        assert authorize.startswith(f"{base_url(run)}/authorize?")
        await owner.consent(authorize)
        redirect = await callback.next()
        assert redirect["iss"] == base_url(run)  # RFC 9207
        await app.tell(**redirect)
        await app.expect("connected")
        await app.tell(list=True)
        assert VOLUME in await app.expect("tools")
        await app.tell(call=VOLUME, arguments={"volume": 42})
        result = await app.expect("result")
        assert not result.get("isError"), result
        assert ("self.audio_speaker.set_volume", {"volume": 42}) in dev.calls
        (client_id,) = app.said("client_id")

        await revoke_in_dashboard(owner, run, client_id)
        await app.tell(call=VOLUME, arguments={"volume": 9})
        failure = await app.expect("error")
        refused = app.said("www_authenticate")
        records = audit_records(run, tmp_path / "data")
    metadata = f"{base_url(run)}/.well-known/oauth-protected-resource/mcp"
    assert f'resource_metadata="{metadata}"' in first_401
    assert failure == "UnauthorizedError"
    assert len(refused) >= 2 and f'resource_metadata="{metadata}"' in refused[-1]
    assert len(app.said("authorize")) == 2  # the app must ask the owner again
    assert ("self.audio_speaker.set_volume", {"volume": 9}) not in dev.calls
    call = next(r for r in records if r["kind"] == "call")
    assert "TypeScript app" in call["caller"] and client_id in call["caller"]
    assert {"register", "grant", "revoke"} <= {r["action"] for r in records if r["kind"] == "oauth"}


# A browser for mcp-remote: hands the URL it is given to the test, which opens it in Chromium.
OPEN = """
import sys, urllib.request
request = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode())
urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=30)
"""


@dataclass
class Opened:
    """The URLs a program asked the browser to open, answered by the owner in Chromium while
    ``answering``; the first one left unanswered sets ``unanswered``."""

    command: Path
    urls: list[str] = field(default_factory=list)
    answering: bool = True
    unanswered: anyio.Event = field(default_factory=anyio.Event)


@asynccontextmanager
async def browser_for(owner: ConsentBrowser, folder: Path) -> AsyncIterator[Opened]:
    """A ``$BROWSER`` command whose URLs the owner's Chromium opens and consents on (until the
    test stops ``answering``)."""
    sending, receiving = anyio.create_memory_object_stream[str](8)

    async def hand_over(scope: Scope, receive: Receive, send: Send) -> None:
        await sending.send((await Request(scope, receive).body()).decode())
        await PlainTextResponse("opened")(scope, receive, send)

    async with (
        sending,
        receiving,
        asgi_server(hand_over, "test-browser") as base,
        anyio.create_task_group() as tasks,
    ):
        command = folder / "browser"
        python, script = shlex.quote(sys.executable), shlex.quote(OPEN)
        command.write_text(f'#!/bin/sh\nexec {python} -c {script} {shlex.quote(base)} "$1"\n')
        command.chmod(0o700)
        opened = Opened(command)

        async def consent_to_each() -> None:
            async for url in receiving:
                opened.urls.append(url)
                if opened.answering:
                    await owner.consent(url)
                else:
                    opened.unanswered.set()

        tasks.start_soon(consent_to_each, name="test-browser-consent")
        yield opened
        tasks.cancel_scope.cancel()


async def test_mcp_remote_signs_in_through_chromium_and_asks_again_after_revoke(
    tmp_path: Path,
) -> None:
    """mcp-remote with no token: it meets the 401, registers, opens the consent page in the
    browser (Chromium, through $BROWSER), takes the code at its own callback, and an MCP SDK
    client on its stdio lists tools and calls one on the device, as the app it registered.
    After Revoke on the dashboard the next call does not reach the device: the owner is asked
    again in the browser.

    The owner does not answer that second time, on purpose. mcp-remote 0.15.1 signs in again
    from every request that meets a 401 at once, without waiting for the others: the revoke
    ends its streams (the client of its HTTP connection test, which it never closes, keeps a
    session with one too), so two or three sign-ins run together. Their writes of its state
    files race (ENOENT on a rename), and once the owner allows, their refreshes present the same
    new refresh token twice, which the gateway rightly takes as a replay (RFC 9700 4.14.2: the
    grant is revoked): the call after a re-consent fails now and then for mcp-remote's reasons.
    Getting through after revocation is asked of the SDK clients (test_oauth*.py), not of
    mcp-remote."""
    remote = npm_package("mcp-remote")
    proxy = remote / json.loads((remote / "package.json").read_text())["bin"]["mcp-remote"]
    async with (
        oauth_gateway(tmp_path / "data") as run,
        listed_device(run, SIM) as dev,
        consent_browser() as owner,
        browser_for(owner, tmp_path) as browser,
    ):
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),  # nothing of the user's: no desktop, no earlier sign-in
            "MCP_REMOTE_CONFIG_DIR": str(tmp_path / "mcp-auth"),
            "BROWSER": str(browser.command),
        }
        params = StdioServerParameters(command=node(), args=[str(proxy), run.mcp_url],
                                       env=env)  # fmt: skip
        with anyio.fail_after(bound(120)):
            async with Client(params, mode="legacy") as client:
                names = [tool.name for tool in (await client.list_tools()).tools]
                result = await client.call_tool(VOLUME, {"volume": 42})
                async with httpx2.AsyncClient(base_url=base_url(run), timeout=bound(10)) as http:
                    apps = (await http.get("/api/oauth/apps", headers=ADMIN)).json()["apps"]
                (app,) = apps
                signed_in = list(browser.urls)
                browser.answering = False
                await revoke_in_dashboard(owner, run, app["client_id"])
                async with anyio.create_task_group() as tasks:
                    # Its outcome is mcp-remote's business (it waits for the owner): not awaited.
                    tasks.start_soon(call_ignoring_outcome, client, {"volume": 9})
                    await browser.unanswered.wait()
                    tasks.cancel_scope.cancel()
        records = audit_records(run, tmp_path / "data")
    assert VOLUME in names and not result.is_error
    assert ("self.audio_speaker.set_volume", {"volume": 42}) in dev.calls
    assert ("self.audio_speaker.set_volume", {"volume": 9}) not in dev.calls
    (url,) = signed_in  # one sign-in, in the browser it opened
    assert url.startswith(f"{base_url(run)}/authorize?")
    assert app["name"] == "MCP CLI Proxy"  # mcp-remote's own registration
    call = next(r for r in records if r["kind"] == "call")
    assert app["client_id"] in call["caller"]
    # The revoked token got nothing: mcp-remote had to send the owner to the consent page again.
    assert browser.urls[1].startswith(f"{base_url(run)}/authorize?")
    timeline = [
        f"call {r['arguments'].get('volume')}" if r["kind"] == "call" else r["action"]
        for r in records
        if r["kind"] == "call" or r.get("action") in ("grant", "revoke")
    ]
    assert timeline == ["grant", "call 42", "revoke"]


async def call_ignoring_outcome(client: Client, arguments: dict[str, Any]) -> None:
    """Call the volume tool, whatever mcp-remote answers (or if it never does)."""
    with suppress(MCPError):
        await client.call_tool(VOLUME, arguments)
