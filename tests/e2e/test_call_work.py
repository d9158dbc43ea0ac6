"""What a tool call costs the gateway, counted rather than timed (issue 29): the work a faster
call path must not quietly bring back."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from mcp import Client
from websockets.protocol import Protocol

import gateway as gateway_package
import gateway.protocol.envelope as envelope
from gateway.devices import audit as audit_module
from gateway.devices.connection import DeviceConnection
from tests.conftest import gateway
from tests.counting import Calls
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
    and the host connections' handshake and authentication deadlines share the listener's.
    The hop's two frames are read and written in place, not by websockets' frame machinery;
    the call's frame is written at once (no lock, flush or await of its own); and no JSON
    encoder is made for them (``json.dumps`` with options makes one a frame)."""
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

            stats: Counter[str] = Counter()
            real_stat = os.stat
            writes = Calls(monkeypatch, audit_module, "_write")

            def counting_stat(path: Any, *args: Any, **kw: Any) -> os.stat_result:
                stats[os.path.basename(os.fsdecode(path))] += 1
                return real_stat(path, *args, **kw)

            work: Counter[str] = Counter()  # the hop's: websockets' frames, flushes, encoders
            _count_calls(monkeypatch, work, Protocol, "receive_data", "send_frame")
            _count_calls(monkeypatch, work, DeviceConnection, "_flush")
            real_encoder = json.JSONEncoder.__init__

            def counting_encoder(encoder: json.JSONEncoder, *args: Any, **kw: Any) -> None:
                frame = sys._getframe(1)
                while frame.f_back is not None and frame.f_code.co_filename == json.__file__:
                    frame = frame.f_back  # past json.dumps: who asked for it
                if _gateway_module(frame.f_globals.get("__name__")) is not None:
                    work[f"JSONEncoder by {frame.f_globals['__name__']}"] += 1
                real_encoder(encoder, *args, **kw)

            monkeypatch.setattr(json.JSONEncoder, "__init__", counting_encoder)

            loop.set_task_factory(counting_task)
            monkeypatch.setattr(loop, "call_at", counting_timer)
            monkeypatch.setattr(os, "stat", counting_stat)
            try:
                for _ in range(CALLS):
                    result = await client.call_tool(TOOL, {})
                    assert not result.is_error
                run.gateway.audit.flush()  # the calls' records, written in the window
            finally:
                loop.set_task_factory(None)
                monkeypatch.setattr(loop, "call_at", call_at)
                monkeypatch.setattr(os, "stat", real_stat)
                monkeypatch.undo()
    assert len(dev.calls) == CALLS + 1
    assert decoder.parsed == CALLS
    assert work == Counter(), work
    # The audit log's writes ask nothing of its file (the stdlib's rollover check made two stats
    # and a seek per write).
    assert stats["audit.log"] == 0
    assert writes.count > 0
    assert tasks == Counter()
    # The calls' deadlines share one timer, and so do the host listener's connections'
    # handshake and authentication deadlines (one timer each): armed by the warm-up call and
    # its connection (still running), again only when one fires; none per call or connection,
    # though the SDK's client opens a connection per call (issue 29).
    assert timers["Timeout._on_timeout"] == 0
    assert timers["Expiries._fire"] <= 3
    assert set(timers) <= {"Expiries._fire", "AuditLog.flush"}
    assert timers["AuditLog.flush"] <= CALLS


def _count_calls(
    monkeypatch: pytest.MonkeyPatch, counts: Counter[str], owner: type, *names: str
) -> None:
    """Count into ``counts`` the calls of ``owner``'s methods ``names`` (sync or async)."""
    for name in names:
        real = getattr(owner, name)
        key = f"{owner.__name__}.{name}"

        def counting(*args: Any, _real: Any = real, _key: str = key, **kw: Any) -> Any:
            counts[_key] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(owner, name, counting)


def _chain(task: asyncio.Task[Any]) -> list[str]:
    """``module:qualname`` of each coroutine ``task`` is suspended in, outermost first."""
    frames: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and hasattr(awaited, "cr_code"):
        module = awaited.cr_frame.f_globals.get("__name__") if awaited.cr_frame else "?"
        frames.append(f"{module}:{awaited.cr_code.co_qualname}")
        awaited = awaited.cr_await
    return frames


# The tasks a host's request runs in: uvicorn's for the HTTP request, the SDK's for its handler.
REQUEST_TASKS = ("RequestResponseCycle.run_asgi", "TaskHandle._run_coro")


class GatewayWork:
    """Counts calls (and coroutine resumptions) of the gateway's own code in a request's tasks;
    not what timers, protocol callbacks and other tasks do meanwhile (the audit log's batched
    write, the listeners' deadlines, the store's write-behind), which falls in a window or not.
    """

    def __init__(self) -> None:
        self.calls = 0
        self._package = str(Path(gateway_package.__file__).parent) + os.sep
        self._simulator = f"{os.sep}simulator{os.sep}"

    def __enter__(self) -> GatewayWork:
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)

    def _event(self, frame: FrameType, event: str, arg: object) -> None:
        task = asyncio.current_task() if event == "call" else None
        if task is not None and getattr(task.get_coro(), "__qualname__", "") in REQUEST_TASKS:
            path = frame.f_code.co_filename
            if path.startswith(self._package) and self._simulator not in path:
                self.calls += 1


async def test_the_host_side_of_a_call_is_its_guards_and_little_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a device that answers at once, what a call costs the gateway beyond the SDK:
    between uvicorn and the SDK's app the request meets the listener's guards only (none of
    Starlette's error, exception and routing layers, whose frames every resumption of the
    request's task would go through), and the gateway's own code in the request's tasks runs at
    most 85 Python calls and resumptions a call: the guards, routing, policy, the caller's
    device scope, the owner's rates and confirmations, the deadline, audit and metrics, and the
    answer as JSON (71 when this was written, 76 before issue 29's round, 73 before issue 45
    added the owner's controls and issue 44 the listing's journal, which a grouped-name lookup
    reads, 78 before the JSON answer's 7, which spare the host a connection a call; the
    listener's connection slot runs in protocol callbacks, what it calls in libraries comes on
    top). The JSON answer's layer is no coroutine: it adds no frame to the chain."""
    chains: list[list[str]] = []
    async with gateway(tmp_path) as run, listed_device(run):
        session = run.gateway.registry.lookup(TOOL).device.session  # type: ignore[union-attr]

        async def at_once(self: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
            for task in asyncio.all_tasks():
                if getattr(task.get_coro(), "__qualname__", "") == REQUEST_TASKS[0]:
                    chains.append(_chain(task))
            return {"content": [{"type": "text", "text": '{"power":false}'}]}

        monkeypatch.setattr(type(session), "call", at_once)  # the class: slots or not
        async with Client(run.mcp_url, mode="legacy") as client:
            await client.call_tool(TOOL, {})  # warm
            with GatewayWork() as work:
                for _ in range(CALLS):
                    assert not (await client.call_tool(TOOL, {})).is_error
    sdk_app = "mcp.server.streamable_http_manager:StreamableHTTPASGIApp.__call__"
    posts = [chain for chain in chains if sdk_app in chain]
    assert posts, chains
    for chain in posts:
        between = chain[1 : chain.index(sdk_app)]  # after uvicorn's run_asgi
        assert between == [
            "uvicorn.middleware.proxy_headers:ProxyHeadersMiddleware.__call__",
            "gateway.host_side.front:HostFront.__call__",
            "gateway.host_side.http:HostOriginGuard.__call__",
            "starlette.middleware.authentication:AuthenticationMiddleware.__call__",
            "gateway.host_side.oauth.guard:RequireToken.__call__",
        ], chain
    assert work.calls <= 85 * CALLS, f"{work.calls / CALLS:.0f} calls of gateway code a call"
