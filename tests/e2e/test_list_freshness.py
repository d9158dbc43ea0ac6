"""Cache hints that never hide a new device (issue 30): a 2026-era SDK client that honours
``ttlMs`` and does not subscribe to changes sees a board that joins within the hint."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from mcp import Client

from gateway.host_side.tool_listing import CHANGING_TTL_MS, SETTLED_TTL_MS
from tests.conftest import bound, gateway
from tests.e2e.helpers import listed_device

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def test_a_board_that_joins_is_seen_within_the_lists_ttl(tmp_path: Path) -> None:
    """The list is cached (SDK 2.3's default cache, no ``listen``) for a few seconds, private;
    once the board has joined, the client's next lists show its tools within that TTL."""
    async with gateway(tmp_path) as run, Client(run.mcp_url) as client:
        before = await client.list_tools()
        assert [t.name for t in before.tools] == [
            "list_devices",
            "call_device_tool",
            "wait_for_event",
            "notify_device",
        ]
        assert before.ttl_ms == CHANGING_TTL_MS and before.cache_scope == "private"
        assert CHANGING_TTL_MS <= 5_000
        async with listed_device(run):
            joined = time.monotonic()
            # The cache expires with time, not with an event: poll it as a host would.
            with anyio.fail_after(bound(CHANGING_TTL_MS / 1000 + 5)):
                lists = 0
                while len((await client.list_tools()).tools) == 3:
                    lists += 1
                    await anyio.sleep(0.1)
            seen_after = time.monotonic() - joined
        assert seen_after <= CHANGING_TTL_MS / 1000 + bound(1), f"{lists} stale lists"


async def test_a_settled_fleet_gets_a_longer_hint_that_a_change_shortens(tmp_path: Path) -> None:
    """Nothing changed for five minutes: a longer TTL, still only seconds; the next change
    makes it short again."""
    async with gateway(tmp_path) as run, Client(run.mcp_url) as client:
        lister = run.gateway.frontend.lister
        lister.current()  # the listing of the fleet as it is (made at the first list)
        lister.changed_at -= 301  # as if the fleet had been quiet for five minutes
        settled = await client.list_tools(cache_mode="refresh")
        assert settled.ttl_ms == SETTLED_TTL_MS <= 15_000
        async with listed_device(run):
            changed = await client.list_tools(cache_mode="refresh")
        assert changed.ttl_ms == CHANGING_TTL_MS and len(changed.tools) > 2
