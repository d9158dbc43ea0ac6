"""A simulated ESP32 that connects to the gateway like stock xiaozhi firmware over WebSocket.

It performs the stock handshake and hello (xiaozhi-protocol.md §1), then serves MCP through a
:class:`~gateway.simulator.mcp_server.DeviceMcpServer` (§4). Every ``tools/call`` runs in its own
task, so a slow tool does not hold back the replies to other requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Iterable, MutableMapping
from types import TracebackType
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from .cjson import JsonObject, dumps
from .errors import DeviceReboot, HandshakeRefused, HelloFailed
from .handshake import (
    HANDSHAKE_TIMEOUT,
    HELLO,
    HELLO_TIMEOUT,
    MAX_FRAME,
    decode_frame,
    request_headers,
    server_hello_session,
)
from .mcp_server import DeviceMcpServer
from .simtool import SimTool
from .tools import BoardState, default_tools

__all__ = ["SimulatedDevice", "backoff_delay"]

logger = logging.getLogger(__name__)

_LIST_CHANGED: JsonObject = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


class _DeviceLog(logging.LoggerAdapter[logging.Logger]):
    """Carries the device id in ``extra`` and prefixes every message with it."""

    def __init__(self, device_id: str) -> None:
        super().__init__(logger, {"device_id": device_id})
        self.device_id = device_id

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        msg, kwargs = super().process(msg, kwargs)
        return f"[{self.device_id}] {msg}", kwargs


class SimulatedDevice:
    """One simulated device: connects, says hello, serves MCP.

    Use it as an async context manager (connected inside the block) or run
    :meth:`run_forever`, which reconnects until cancelled.

    Args:
        url: the gateway's device WebSocket, e.g. ``ws://127.0.0.1:8765/xiaozhi/v1/``.
        token: the device token, sent as ``Authorization: Bearer <token>``; None sends none.
        device_id: the MAC address sent as ``Device-Id`` (lowercased, as stock).
        board: the board name, reported as ``serverInfo.name``.
        tools: the tools to serve; None means the default catalogue on a fresh board.
        error_codes: send JSON-RPC error codes (our firmware) instead of none (stock).
        list_changed: announce tool changes with ``notifications/tools/list_changed``.
        ping: answer MCP ``ping`` (our firmware) instead of "Method not implemented" (stock).
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        device_id: str = "02:00:00:00:00:01",
        board: str = "sim-esp32",
        tools: Iterable[SimTool] | None = None,
        error_codes: bool = False,
        list_changed: bool = True,
        ping: bool = False,
    ) -> None:
        self.url = url
        self.device_id = device_id.lower()
        # Stock firmware generates its Client-Id once and keeps it in NVS (§1).
        self.client_id = str(uuid.uuid4())
        self.board = BoardState(device_id=self.device_id, client_id=self.client_id, board=board)
        catalogue = default_tools(self.board) if tools is None else tools
        self.mcp = DeviceMcpServer(catalogue, board=board, error_codes=error_codes, ping=ping)
        self.list_changed = list_changed
        #: Every ``tools/call`` received, as (tool name, raw arguments), in arrival order.
        self.calls: list[tuple[str, JsonObject]] = []
        #: The session id from the last server hello; a hello without one keeps it (§1).
        self.session_id = ""
        self._token = token
        self._ws: ClientConnection | None = None
        self._serving: asyncio.Task[None] | None = None
        self._hello: asyncio.Future[str] | None = None
        self._call_seen = asyncio.Event()
        self._log = _DeviceLog(self.device_id)

    @property
    def connected(self) -> bool:
        """Whether the device is connected, past the hello and serving."""
        hello_done = self._hello is not None and self._hello.done()
        return hello_done and self._serving is not None and not self._serving.done()

    async def __aenter__(self) -> Self:
        """Connect, exchange hellos and start serving in a background task.

        Raises:
            HandshakeRefused: the gateway answered the upgrade with an HTTP error status.
            HelloFailed: no acceptable server hello within 10 s.
            OSError: the gateway could not be reached.
        """
        self._ws = ws = await self._open()
        self._hello = hello = asyncio.get_running_loop().create_future()
        name = f"simulator[{self.device_id}].serve"
        self._serving = serving = asyncio.create_task(self._serve(ws), name=name)
        try:
            # If this send fails, the serving task fails the hello: no separate error path.
            with contextlib.suppress(ConnectionClosed):
                await self._send(ws, HELLO)
            self.session_id = await _await_hello(hello)
        except BaseException:
            hello.cancel()
            ws.transport.abort()
            await asyncio.wait({serving})
            raise
        self._log.info("connected to %s, session %r", self.url, self.session_id)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the connection with a close frame and wait for serving to end."""
        if self._ws is not None:
            await self._ws.close()
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Wait until the connection is gone (closed by either side, dropped, or rebooted).

        Cancelling this wait (a timeout, say) leaves the device connected.
        """
        serving = self._serving
        if serving is None:
            return
        await asyncio.wait({serving})
        if not serving.cancelled():
            serving.result()  # re-raise what broke the serving task, if anything did

    async def drop(self) -> None:
        """Vanish like a device losing power: close the TCP connection without a close frame."""
        self._abort()
        await self.wait_closed()

    # A timeout parameter on purpose: every test wait must be bounded, so the bound is built in.
    async def wait_for_call(
        self,
        name: str,
        timeout: float = 5.0,  # noqa: ASYNC109
        *,
        start: int = 0,
    ) -> JsonObject:
        """Wait for a ``tools/call`` of ``name`` and return its arguments.

        Calls already received count: the first match at index ``start`` or later in
        :attr:`calls` is returned.

        Raises:
            TimeoutError: no such call within ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while True:
                for tool, arguments in self.calls[start:]:
                    if tool == name:
                        return arguments
                await self._call_seen.wait()

    async def add_tool(self, tool: SimTool) -> None:
        """Register ``tool`` and, if connected and ``list_changed``, announce the change.

        Raises:
            ValueError: a tool with that name is already registered.
        """
        self.mcp.add_tool(tool)
        await self._announce_change()

    async def remove_tool(self, name: str) -> None:
        """Unregister the tool ``name`` and, if connected and ``list_changed``, announce it.

        Raises:
            KeyError: no such tool.
        """
        self.mcp.remove_tool(name)
        await self._announce_change()

    async def run_forever(self) -> None:
        """Stay connected until cancelled: reconnect after a drop, a reboot or a refusal.

        Retries back off exponentially with jitter from 1 s to 30 s; a session that got as far
        as the hello resets the backoff.
        """
        attempt = 0
        while True:
            try:
                async with self:
                    attempt = 0
                    await self.wait_closed()
                self._log.info("disconnected; reconnecting")
            except HandshakeRefused as exc:
                self._log.error("%s", exc)
            except (OSError, InvalidHandshake, HelloFailed, TimeoutError) as exc:
                self._log.warning("cannot connect to %s: %s", self.url, exc)
            delay = backoff_delay(attempt)
            attempt += 1
            self._log.debug("retrying in %.1f s", delay)
            await asyncio.sleep(delay)

    async def _open(self) -> ClientConnection:
        try:
            ws = await connect(
                self.url,
                additional_headers=request_headers(self._token, self.client_id, self.device_id),
                # Stock esp-ml307 sends no User-Agent, offers no compression, never pings (§1).
                user_agent_header=None,
                compression=None,
                ping_interval=None,
                proxy=None,
                open_timeout=HANDSHAKE_TIMEOUT,
            )
        except InvalidStatus as exc:
            raise HandshakeRefused(self.url, exc.response.status_code) from exc
        return ws

    async def _serve(self, ws: ClientConnection) -> None:
        calls: set[asyncio.Task[None]] = set()
        try:
            async with asyncio.TaskGroup() as tg:
                try:
                    async for frame in ws:
                        if self._log.isEnabledFor(logging.DEBUG):
                            self._log.debug("< %r", frame)
                        message = decode_frame(frame, self._log)
                        if message is not None:
                            await self._on_message(tg, calls, message)
                except ConnectionClosed:
                    pass
                for task in calls:
                    task.cancel()
        finally:
            self._log.info("connection closed (%s)", ws.close_code)
            self._settle_hello(HelloFailed("connection closed before the server hello"))

    async def _on_message(
        self, tg: asyncio.TaskGroup, calls: set[asyncio.Task[None]], message: JsonObject
    ) -> None:
        kind, payload = message.get("type"), message.get("payload")
        if kind == "hello":
            self._on_hello(message)
            return
        # §1.1: anything but an mcp message with an object payload is ignored here. MCP is
        # served even before the server hello, with session_id "" (stock does the same).
        if kind != "mcp" or not isinstance(payload, dict):
            return
        if payload.get("method") != "tools/call":
            await self._answer(payload)
            return
        self._record_call(payload)
        name = f"simulator[{self.device_id}].call[{payload.get('id')}]"
        task = tg.create_task(self._answer(payload), name=name)
        calls.add(task)
        task.add_done_callback(calls.discard)

    def _on_hello(self, hello: JsonObject) -> None:
        # Stock firmware parses every server hello, not only the one it waits for (§1).
        try:
            session_id = server_hello_session(hello, self.session_id, self._log)
        except HelloFailed as exc:
            self._log.error("%s; dropping off", exc)
            self._settle_hello(exc)
            self._abort()
            return
        if session_id is not None:
            self.session_id = session_id
            self._settle_hello(session_id)

    def _settle_hello(self, outcome: str | HelloFailed) -> None:
        hello = self._hello
        if hello is None or hello.done():
            return
        if isinstance(outcome, HelloFailed):
            hello.set_exception(outcome)
        else:
            hello.set_result(outcome)

    def _record_call(self, payload: JsonObject) -> None:
        params = payload.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        if not isinstance(params, dict) or not isinstance(name, str):
            return
        arguments = params.get("arguments")
        self.calls.append((name, arguments if isinstance(arguments, dict) else {}))
        self._call_seen.set()
        self._call_seen = asyncio.Event()

    async def _answer(self, payload: JsonObject) -> None:
        try:
            reply = await self.mcp.handle(payload)
        except DeviceReboot:
            self._log.warning("rebooting: the connection drops and the call gets no reply")
            self._abort()
            return
        if reply is not None:
            await self._send_mcp(reply)

    async def _announce_change(self) -> None:
        if self.list_changed and self.connected:
            await self._send_mcp(_LIST_CHANGED)

    async def _send_mcp(self, payload: JsonObject) -> None:
        ws = self._ws
        if ws is None:
            return
        envelope: JsonObject = {"session_id": self.session_id, "type": "mcp", "payload": payload}
        try:
            await self._send(ws, envelope)
        except ConnectionClosed:
            self._log.debug("connection closed; message lost")

    async def _send(self, ws: ClientConnection, message: JsonObject) -> None:
        text = dumps(message)
        size = len(text.encode())
        if size > MAX_FRAME:
            # §7.3: a stock device fails the send and loses its channel.
            self._log.error("a %d-byte message exceeds the %d-byte frame limit", size, MAX_FRAME)
            ws.transport.abort()
            return
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("> %s", text)
        await ws.send(text)

    def _abort(self) -> None:
        if self._ws is not None:
            self._ws.transport.abort()


def backoff_delay(attempt: int, rng: random.Random | None = None) -> float:
    """Return the seconds to wait before reconnect attempt ``attempt`` (0-based).

    The ceiling doubles from 1 s up to 30 s; the delay is jittered down to half of it, never
    below 1 s, so that a fleet restarted together does not reconnect in lockstep.
    """
    ceiling = min(30.0, 2.0**attempt)
    return (rng or random).uniform(max(1.0, ceiling / 2), ceiling)


async def _await_hello(hello: asyncio.Future[str]) -> str:
    try:
        async with asyncio.timeout(HELLO_TIMEOUT):
            return await hello
    except TimeoutError:
        raise HelloFailed(f"no acceptable server hello within {HELLO_TIMEOUT:g} s") from None
