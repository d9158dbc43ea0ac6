"""Abandoned MCP HTTP sessions (issue 30): closed after ``[host] session_idle_timeout``; a
host that stays connected keeps its session."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from tests.conftest import bound, gateway

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
               "clientInfo": {"name": "run-and-quit", "version": "1"}},
}  # fmt: skip


async def abandoned_session(http: httpx2.AsyncClient, url: str) -> str:
    """A client run that initializes, then quits without DELETE: its session id."""
    reply = await http.post(url, json=INITIALIZE, headers=HEADERS)
    assert reply.status_code == 200
    session = reply.headers["mcp-session-id"]
    headers = {**HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"}
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    done = await http.post(url, headers=headers, json=initialized)
    assert done.status_code == 202
    return session


async def test_abandoned_sessions_close_when_idle_and_a_listening_host_stays(
    tmp_path: Path,
) -> None:
    """Twenty client runs that quit without ending their sessions leave none behind once idle
    (their ids then answer 404); a host connected all along keeps its session and still works."""
    # Long enough for all twenty to open before the first one's idle time is up.
    idle = bound(2.0)
    async with gateway(tmp_path, host_session_idle_timeout=idle) as run:
        notifier = run.gateway.frontend.notifier
        async with Client(run.mcp_url, mode="legacy") as host, httpx2.AsyncClient() as http:
            with anyio.fail_after(bound(10)):
                await notifier.wait_for_sessions(1)
            sessions = [await abandoned_session(http, run.mcp_url) for _ in range(20)]
            with anyio.fail_after(idle + bound(10)):
                await notifier.wait_for_sessions(21)
                await notifier.wait_for_sessions(1)  # the idle ones closed; the host's stayed
            stale = await http.post(
                run.mcp_url,
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                headers={**HEADERS, "mcp-session-id": sessions[0],
                         "mcp-protocol-version": "2025-06-18"},
            )  # fmt: skip
            assert stale.status_code == 404
            assert [t.name for t in (await host.list_tools()).tools][:1] == ["list_devices"]
