"""What a tool call costs the gateway, counted rather than timed (issue 29): the work a faster
call path must not quietly bring back."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

import gateway.protocol.envelope as envelope
from tests.conftest import gateway
from tests.e2e.helpers import listed_device

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

CALLS = 5
TOOL = "sim-esp32_0001_lamp_get_state"


def _gateway_module(module: object) -> str | None:
    """The gateway's own module (the simulated device is not the gateway), else None."""
    if isinstance(module, str) and module.startswith("gateway.") and ".simulator" not in module:
        return module
    return None


class CountingDecoder:
    """The device frame decoder, counting what it parses."""

    def __init__(self, decoder: Any) -> None:
        self.decoder, self.parsed = decoder, 0

    def decode(self, text: str) -> Any:
        self.parsed += 1
        return self.decoder.decode(text)


async def test_a_call_parses_one_device_frame_and_starts_no_gateway_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per call through MCP: the device's reply is the only frame the gateway parses, the
    gateway's code starts no task (the caller sends its frame; uvicorn's request task is the
    SDK server's as much as ours) and arms no timer of its own: the calls' deadlines share one,
    and the host connection's request deadline is the listener's."""
    async with gateway(tmp_path) as run, listed_device(run) as dev:
        async with Client(run.mcp_url, mode="legacy") as client:
            await client.call_tool(TOOL, {})  # warm: the client's schema cache, the audit file
            decoder = CountingDecoder(envelope._DECODER)
            monkeypatch.setattr(envelope, "_DECODER", decoder)
            tasks: Counter[str] = Counter()
            timers: Counter[str] = Counter()
            loop = asyncio.get_running_loop()
            call_at = loop.call_at

            def counting_task(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> Any:
                frame = getattr(coro, "cr_frame", None)
                module = _gateway_module(frame.f_globals.get("__name__") if frame else None)
                if module is not None:
                    tasks[f"{module}.{coro.__qualname__}"] += 1
                return asyncio.Task(coro, loop=loop, **kw)

            def counting_timer(when: float, callback: Any, *args: Any, **kw: Any) -> Any:
                owner = getattr(callback, "__self__", None)
                module = getattr(callback, "__module__", None) or type(owner).__module__
                if _gateway_module(module) is not None or module == "asyncio.timeouts":
                    timers[getattr(callback, "__qualname__", repr(callback))] += 1
                return call_at(when, callback, *args, **kw)

            loop.set_task_factory(counting_task)
            monkeypatch.setattr(loop, "call_at", counting_timer)
            try:
                for _ in range(CALLS):
                    result = await client.call_tool(TOOL, {})
                    assert not result.is_error
            finally:
                loop.set_task_factory(None)
                monkeypatch.setattr(loop, "call_at", call_at)
    assert len(dev.calls) == CALLS + 1
    assert decoder.parsed == CALLS
    assert tasks == Counter()
    # The calls' deadlines share one timer, armed by the first call (the warm-up's, still
    # running) and again only when it fires: none of their own (issue 29).
    assert timers["Timeout._on_timeout"] == 0
    assert timers["_Queue._fire"] <= 1
    # One host connection per call (the SDK's client), whose request deadline is armed when
    # it opens and again once the response is out; the audit log's batched write, at most.
    assert timers["Slot._on_timer"] <= 2 * CALLS
    assert set(timers) <= {"_Queue._fire", "Slot._on_timer", "AuditLog.flush"}
    assert timers["AuditLog.flush"] <= CALLS
