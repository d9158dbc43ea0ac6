"""A device that never stops sending hostile frames: the gateway's memory settles (issue 21).

One raw device on a real WebSocket sends thousands of frames: a new catalogue of rejected
tools after every listing (it says ``tools/list_changed`` each time), garbage JSON, binary
frames, replies to calls nobody made, unknown message types. Memory is measured with
tracemalloc snapshots (what the gateway's own code holds, by line), never RSS or time: after a
warm-up round, another round as long must leave nothing behind per frame or per catalogue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.app import Running
from tests.conftest import bound, gateway
from tests.e2e.helpers import RawDevice, until

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

JsonObject = dict[str, Any]

ROUND = 250  # catalogues a round; each with 7 more frames (GARBAGE, binary, list_changed): 2,000
GARBAGE = (
    "{not json",
    json.dumps({"type": "mcp", "payload": {"jsonrpc": "2.0", "id": 987654, "result": {}}}),
    json.dumps({"type": "no-such-type", "x": "y" * 200}),
    json.dumps({"type": "mcp", "payload": "not an object"}),
    json.dumps([1, 2, 3]),
)
GATEWAY_CODE = str(Path(__file__).resolve().parents[2] / "gateway")
SETTLED_BYTES = 64 * 1024  # what the second round may add: caches filling their last slots


class HostileDevice(RawDevice):
    """Lists a fresh catalogue each time (every tool rejected but the last), and asks to be
    listed again with garbage in between, ``rounds`` catalogues in all."""

    def __init__(self) -> None:
        super().__init__("02:00:00:00:0b:ad", "hostile", [])
        self.listed = 0
        self.rounds = anyio.Event()
        self.limit = 0

    async def respond(self, message: JsonObject) -> JsonObject | None:
        payload = message.get("payload")
        if isinstance(payload, dict) and payload.get("method") == "tools/list":
            self.listed += 1
            n = self.listed
            self.tools = [
                {"name": f"self.bad_{n}_{i}", "description": "x", "inputSchema": {"type": 5}}
                for i in range(4)
            ] + [{"name": "self.ok", "description": f"fine {n}", "inputSchema": {"type": "object"}}]
            reply = self._answer(message)
            if self._ws is not None and n < self.limit:
                await self._ws.send(json.dumps(reply))
                for frame in GARBAGE:
                    await self._ws.send(frame)
                await self._ws.send(b"\x00\x01binary")
                changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
                await self._ws.send(json.dumps({"type": "mcp", "payload": changed}))
                return None
            if n >= self.limit:
                self.rounds.set()
            return reply
        return self._answer(message)


def held_by_gateway(snapshot: tracemalloc.Snapshot) -> dict[str, int]:
    """Bytes the gateway's own code allocated and still holds, by line."""
    lines: dict[str, int] = {}
    for stat in snapshot.filter_traces([tracemalloc.Filter(True, GATEWAY_CODE + "/*")]).statistics(
        "lineno"
    ):
        lines[str(stat.traceback[0])] = stat.size
    return lines


async def run_round(device: HostileDevice, until_listed: int) -> None:
    device.rounds = anyio.Event()
    device.limit = until_listed
    # Ask for a listing: the device answers with a catalogue, garbage and list_changed again.
    assert device._ws is not None
    changed = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    await device._ws.send(json.dumps({"type": "mcp", "payload": changed}))
    with anyio.fail_after(bound(120)):
        await device.rounds.wait()


@contextlib.contextmanager
def logs_written_not_kept() -> Iterator[None]:
    """Log as a service does, to a stream; pytest's capture keeps every record for its report,
    which is not the gateway's memory."""
    root = logging.getLogger()
    kept = root.handlers[:]
    with open(os.devnull, "w", encoding="utf-8") as null:
        root.handlers = [logging.StreamHandler(null)]
        try:
            yield
        finally:
            root.handlers = kept


def counts(run: Running) -> dict[str, int]:
    """Entries of the caches and tables that a hostile device could grow."""
    registry = run.gateway.registry
    with sqlite3.connect(run.gateway.config.data_dir / "registry.sqlite3") as db:
        stored = db.execute("SELECT COUNT(*) FROM catalogues").fetchone()[0]
    return {
        "catalogues in memory": len(registry.known.catalogues._by_digest),
        "catalogue rows": stored,
        "devices": len(registry.devices()),
        "login records table": len(registry.admin.logins),
        "tool names": len(registry.known._names.entries()),
    }


async def test_memory_settles_under_thousands_of_hostile_frames(tmp_path: Path) -> None:
    """Two rounds of 250 catalogues and 2,000 frames each: the second leaves no more behind
    than a few caches' last slots, and no cache holds an entry per catalogue seen."""
    # Its list_changed comes with every listing: listed at once (relist_interval has its own
    # tests), 500 catalogues take seconds, not two minutes.
    async with gateway(tmp_path, relist_interval=1e-6) as run:
        device = HostileDevice()
        registry = run.gateway.registry
        async with anyio.create_task_group() as tg, registry.changes() as changes:
            await tg.start(device.serve, run.device_url)
            await until(changes, lambda: bool((d := registry.get(device.device_id)) and d.tools))
            tracemalloc.start(1)
            try:
                with logs_written_not_kept():
                    await run_round(device, ROUND)
                    await run.gateway.store.commit()  # what the writer holds goes to disk
                    first, warm = tracemalloc.take_snapshot(), counts(run)
                    await run_round(device, 2 * ROUND)
                    await run.gateway.store.commit()
                    second, after = tracemalloc.take_snapshot(), counts(run)
            finally:
                tracemalloc.stop()
            await device.close()
    assert device.listed >= 2 * ROUND
    assert after == warm, f"entries grew with the catalogues: {warm} -> {after}"
    before, now = held_by_gateway(first), held_by_gateway(second)
    grew = {line: now[line] - before.get(line, 0) for line in now}
    growth = sum(size for size in grew.values() if size > 0)
    worst = sorted(grew.items(), key=lambda item: -item[1])[:5]
    assert growth < SETTLED_BYTES, f"the gateway kept {growth} bytes more after a round: {worst}"
