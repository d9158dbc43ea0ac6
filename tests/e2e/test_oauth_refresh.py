"""Refreshes that race or are retried (issue 41): one refresh token presented twice within the
grace period gets the same new pair, and the grant lives; presented after it, it ends the grant.
The access token a refresh replaced keeps working a short while, for the requests in flight.

mcp-remote 0.15.1 refreshes twice at once after a revoke (shared/reference/field-notes.md), and
any app retries a refresh whose answer a crash lost: both look like a replay to a strict rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx2
import pytest
from anyio.streams.text import TextReceiveStream
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.host_side.oauth.store import REFRESH_GRACE
from tests.conftest import bound
from tests.e2e.test_stdio_and_cli import cli_env
from tests.oauth_helpers import (
    ADMIN,
    HOST_TOKEN,
    ManualGrant,
    base_url,
    callback_server,
    consent_browser,
    granting,
    manual_grant,
    mcp_with,
)
from tests.ports import announced_ports

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


def refresh_form(grant: ManualGrant, refresh_token: str) -> dict[str, str]:
    """The refresh request of a public client (the form HA core and the SDKs send)."""
    return {
        "grant_type": "refresh_token",
        "client_id": grant.client_id,
        "refresh_token": refresh_token,
    }


async def connected_apps(http: httpx2.AsyncClient) -> list[str]:
    answer = await http.get("/api/oauth/apps", headers=ADMIN)
    return [app["client_id"] for app in answer.json()["apps"]]


async def test_two_concurrent_refreshes_get_one_pair_and_a_late_replay_ends_the_grant(
    tmp_path: Path,
) -> None:
    """Two refreshes at once with one refresh token both get the same new pair; its access
    token works, and so does the replaced one until the overlap ends. Past the grace period (the
    store's clock moved, no sleep) the old refresh token is a replay: the grant ends."""
    async with granting(tmp_path) as (run, callback, owner, http):
        grant = await manual_grant(http, owner, callback, base_url(run))
        first = (await http.post("/token", data=grant.redeem_form())).json()
        form = refresh_form(grant, first["refresh_token"])
        racing = await asyncio.gather(*(http.post("/token", data=form) for _ in range(2)))
        assert [answer.status_code for answer in racing] == [200, 200], racing[1].text
        pairs = {(a.json()["access_token"], a.json()["refresh_token"]) for a in racing}
        assert len(pairs) == 1
        ((access, refresh),) = pairs
        assert refresh != first["refresh_token"] and access != first["access_token"]
        assert (await mcp_with(http, access)).status_code == 200
        assert (await mcp_with(http, first["access_token"])).status_code == 200  # in flight
        assert await connected_apps(http) == [grant.client_id]

        store = run.gateway.oauth.store  # type: ignore[union-attr]
        clock = store.clock
        store.clock = lambda: clock() + REFRESH_GRACE + 1
        replaced = await mcp_with(http, first["access_token"])
        current = await mcp_with(http, access)
        replay = await http.post("/token", data=form)
        after = await mcp_with(http, access)
        apps = await connected_apps(http)
    assert replaced.status_code == 401  # the overlap ended
    assert current.status_code == 200
    assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
    assert after.status_code == 401  # the late replay ended the grant
    assert apps == []


# --- SIGKILL between the refresh's commit and its answer ---------------------------------------


class Forwarder:
    """A TCP relay on a loopback port of its own to whichever gateway runs now: the app's URL
    (and so the resource its tokens are for) stays one across restarts, as a real gateway's
    fixed port does, while each gateway process binds port 0."""

    def __init__(self) -> None:
        self.url = ""
        self.target = 0

    async def relay(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", self.target)
            except OSError:
                return
            async with upstream, anyio.create_task_group() as pipes:

                async def pipe(
                    source: anyio.abc.SocketStream, sink: anyio.abc.SocketStream
                ) -> None:
                    with contextlib.suppress(anyio.BrokenResourceError, OSError):
                        async for chunk in source:
                            await sink.send(chunk)
                    pipes.cancel_scope.cancel()  # one side ended: so does the connection

                pipes.start_soon(pipe, client, upstream)
                pipes.start_soon(pipe, upstream, client)


@asynccontextmanager
async def forwarder() -> AsyncIterator[Forwarder]:
    """A ``Forwarder`` listening; set its ``target`` to a gateway's host port."""
    relay = Forwarder()
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    relay.url = f"http://127.0.0.1:{port}"
    async with listener, anyio.create_task_group() as serving:
        serving.start_soon(listener.serve, relay.relay)
        try:
            yield relay
        finally:
            serving.cancel_scope.cancel()


class Stderr:
    """A gateway process's stderr, read to the end as it comes (a full pipe would block the
    gateway's logging), and waited on for a line."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process, self.lines = process, list[str]()
        self._more = anyio.Event()

    async def read(self) -> None:
        assert self.process.stderr is not None
        buffer = ""
        async for chunk in TextReceiveStream(self.process.stderr):
            *complete, buffer = (buffer + chunk).split("\n")
            self.lines += complete
            self._more.set()
        self._more.set()

    async def until(self, text: str, start: int = 0) -> int:
        """The index of the first line from ``start`` containing ``text`` (waits for it)."""
        with anyio.fail_after(bound(30)):
            while True:
                for index in range(start, len(self.lines)):
                    if text in self.lines[index]:
                        return index
                if self.process.returncode is not None:
                    raise AssertionError(f"exited before {text!r}:\n" + "\n".join(self.lines))
                self._more = anyio.Event()
                await self._more.wait()


@asynccontextmanager
async def gateway_process(data: Path, relay: Forwarder) -> AsyncIterator[Stderr]:
    """``python -m gateway serve`` on ``data`` with a host token and debug logs, behind
    ``relay``; killed on exit if it still runs."""
    env = cli_env(
        data,
        GATEWAY_DEVICE_LISTEN="127.0.0.1:0",
        GATEWAY_HOST_LISTEN="127.0.0.1:0",
        GATEWAY_HOST_TOKEN=HOST_TOKEN,
        GATEWAY_LOG_LEVEL="debug",
    )
    process = await anyio.open_process([sys.executable, "-m", "gateway", "serve"], env=env)
    stderr = Stderr(process)
    try:
        async with anyio.create_task_group() as reading:
            reading.start_soon(stderr.read)
            started = await stderr.until("MCP hosts connect to")
            relay.target = announced_ports("\n".join(stderr.lines[: started + 1]))["hosts"]
            yield stderr
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        await process.aclose()


async def send_unread(url: str, path: str, form: dict[str, str]) -> anyio.abc.SocketStream:
    """POST ``form`` to ``path`` on a raw connection whose answer is never read."""
    host = urllib.parse.urlsplit(url)
    body = urllib.parse.urlencode(form).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host.netloc}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    stream = await anyio.connect_tcp(host.hostname or "", host.port or 80)
    await stream.send(head.encode() + body)
    return stream


async def test_sigkill_after_the_refresh_commits_and_the_retry_keeps_the_app_signed_in(
    tmp_path: Path,
) -> None:
    """A real gateway process commits a refresh and is SIGKILLed before the app read its
    answer (to the app, the answer was lost); restarted on the same data dir, it answers the
    app's retry of the same refresh token with a working pair: the app stays signed in, and
    its next refresh works too."""
    data = tmp_path / "data"
    async with (
        forwarder() as relay,
        callback_server() as callback,
        consent_browser() as owner,
    ):
        async with (
            gateway_process(data, relay) as stderr,
            httpx2.AsyncClient(base_url=relay.url, timeout=bound(10)) as http,
        ):
            grant = await manual_grant(http, owner, callback, relay.url)
            first = (await http.post("/token", data=grant.redeem_form())).json()
            form = refresh_form(grant, first["refresh_token"])
            lost = await send_unread(relay.url, "/token", form)
            await stderr.until("refreshed its tokens")
            stderr.process.send_signal(signal.SIGKILL)
            await stderr.process.wait()
            await lost.aclose()
        assert stderr.process.returncode == -signal.SIGKILL
        async with (
            gateway_process(data, relay),
            httpx2.AsyncClient(base_url=relay.url, timeout=bound(10)) as http,
        ):
            retry = await http.post("/token", data=form)
            assert retry.status_code == 200, retry.text
            tokens: dict[str, Any] = retry.json()
            headers = {"Authorization": f"Bearer {tokens['access_token']}"}
            async with httpx2.AsyncClient(headers=headers, timeout=bound(10)) as app_http:
                mcp = streamable_http_client(f"{relay.url}/mcp", http_client=app_http)
                async with Client(mcp) as client:
                    listed = [tool.name for tool in (await client.list_tools()).tools]
            following = await http.post("/token", data=refresh_form(grant, tokens["refresh_token"]))
            apps = await connected_apps(http)
    assert "list_devices" in listed
    assert following.status_code == 200, following.text
    assert apps == [grant.client_id]
