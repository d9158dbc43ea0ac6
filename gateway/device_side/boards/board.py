"""One board's life: check its address, open its MCP transport, serve it, and come back.

The gateway is the board's MCP client through the SDK's own transports: streamable HTTP first
and, when a board does not answer ``initialize`` there, the older HTTP+SSE transport (a URL
ending in ``/sse`` starts with SSE). Every attempt first asks admission (a rejected board is
not contacted) and checks where the URL resolves (``address.resolve_board``: a board not added
by the owner, found over mDNS, only inside the discovery networks). Between
attempts the wait doubles from one second up to ``[mcp_boards] retry_max``; a session that got
as far as ``initialize`` starts the count again.

In a cluster one replica holds each board (gateway/cluster/boards.py): ``owns`` says whether
this one does, and the board waits while it does not. ``reown()`` asks again; a session here
that another replica holds by the rule now is kept until that replica announces the board (the
cluster then ends this one) or ``HANDOVER`` passes: hosts see no offline blink.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import Any

from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from gateway.config import Config
from gateway.device_side.boards.address import Target, resolve_board
from gateway.device_side.boards.http import BoardHttp
from gateway.device_side.boards.link import BoardLink
from gateway.devices.link import BOARD_TRANSPORT, DeviceIdentity
from gateway.devices.registry import DeviceRegistry
from gateway.net.networks import Network
from gateway.protocol import envelope

__all__ = ["Board", "board_id"]

logger = logging.getLogger(__name__)

RETRY_MIN = 1.0
# cluster: seconds a session is kept once another replica holds the board (that one connects
# in milliseconds; a replica cut from the cluster broker never hears it did)
HANDOVER = 10.0
STREAMABLE, SSE = "streamable HTTP", "SSE"


def board_id(url: str) -> str:
    """The device id of the board at ``url``: stable, and the same on every replica."""
    return "mcp-" + hashlib.sha256(url.encode()).hexdigest()[:12]


Serve = Callable[[BoardLink, DeviceIdentity], Awaitable[None]]


class Board:
    """Connects to one board and keeps it connected until ``stop()``."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        trusted: bool,
        config: Config,
        registry: DeviceRegistry,
        serve: Serve,
        own_ports: Callable[[], Collection[int]],
        networks: Callable[[], Sequence[Network]],
        owns: Callable[[str], bool],
    ) -> None:
        self.url = url
        self.device_id = board_id(url)
        self.trusted = trusted  # added by the owner: approved; discovered: pending until approved
        self.problem: str | None = None  # why the last attempt failed, for list_devices and logs
        self._token = token
        self._config = config
        self._registry = registry
        self._serve = serve
        self._own_ports = own_ports
        self._networks = networks  # where it may be while not trusted (discovered)
        self._task: asyncio.Task[None] | None = None
        self._link: BoardLink | None = None  # the current attempt's
        self.attempted = asyncio.Event()  # set once an attempt has ended (tests wait on it)
        self._owns = owns  # cluster: does this replica hold it (by its id)?
        self._reowned = asyncio.Event()  # who holds it may have changed
        self._leaving: asyncio.TimerHandle | None = None  # armed while held elsewhere
        self._closing: set[asyncio.Task[None]] = set()
        self._kind = SSE if urllib.parse.urlsplit(url).path.rstrip("/").endswith("/sse") else (
            STREAMABLE)  # fmt: skip

    def owned(self) -> bool:
        """Does this replica hold the board (always, on a single gateway)?"""
        return self._owns(self.device_id)

    def start(self) -> None:
        """Start connecting (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"gateway.board[{self.device_id}]")

    async def stop(self) -> None:
        """Disconnect and stop trying."""
        task, self._task = self._task, None
        if self._leaving is not None:
            self._leaving.cancel()
            self._leaving = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        delay = RETRY_MIN
        failed_kinds = 0
        while True:
            while not self.owned():  # cluster: another replica holds it
                self._reowned.clear()
                await self._reowned.wait()
            self._link = None
            initialized: bool | None
            try:
                initialized = await self._attempt()
            except Exception as exc:  # one board's failure must never end the others'
                self.problem = _reason(exc)
                logger.warning("board %s: %s", self.url, self.problem)
                initialized = self._link is not None and self._link.initialized
            self.attempted.set()
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # stop() cancelled this attempt, and the SDK's task group took the cancellation
                # for its own (a connect failing as it came): end here, not sleep and retry.
                raise asyncio.CancelledError
            if initialized:
                delay, failed_kinds = RETRY_MIN, 0
            elif initialized is None:  # refused before any request: no other transport to try
                pass
            else:
                failed_kinds += 1
                self._kind = SSE if self._kind == STREAMABLE else STREAMABLE
                if failed_kinds < 2:
                    continue  # the other transport at once
                failed_kinds = 0
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._config.boards_retry_max)

    def reown(self) -> None:
        """cluster: who holds the board may have changed: connect if this replica does now;
        end the session here ``HANDOVER`` seconds after another replica started to."""
        self._reowned.set()
        link = self._link
        if link is None or link.closed or self.owned() or self._leaving is not None:
            return
        self._leaving = asyncio.get_running_loop().call_later(HANDOVER, self._hand_over, link)

    def _hand_over(self, link: BoardLink) -> None:
        self._leaving = None
        if self._link is link and not self.owned():
            task = asyncio.create_task(link.aclose(), name=f"gateway.board.leave[{self.url}]")
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _attempt(self) -> bool | None:
        """One connection; True if the board answered ``initialize`` on it, None if refused."""
        identity = DeviceIdentity(self.device_id, f"board:{self.url}", BOARD_TRANSPORT,
                                  host=urllib.parse.urlsplit(self.url).netloc)  # fmt: skip
        admin = self._registry.admin
        refusal = admin.admit(self.device_id, trusted=self.trusted,
                              client_id=identity.client_id, transport=BOARD_TRANSPORT,
                              peer=identity.host)  # fmt: skip
        if refusal is None:
            await admin.commit_decisions()
            within = None if self.trusted else self._networks()
            target = await resolve_board(self.url, self._own_ports(), within)
            refusal = target if isinstance(target, str) else None
        if refusal is not None:
            if refusal != self.problem:
                logger.warning("board %s: not connecting: %s", self.url, refusal)
            self.problem = refusal
            return None  # nothing to fall back to: wait longer each time, then ask again
        assert isinstance(target, Target)
        async with self._transport(target) as (read, write):
            link = BoardLink(read, write, envelope.new_session_id(),
                             max_bytes=self._config.boards_max_message_bytes,
                             label=self.url)  # fmt: skip
            self._link = link
            pinger = asyncio.create_task(self._ping(link), name=f"gateway.board.ping[{self.url}]")
            try:
                await self._serve(link, identity)
            finally:
                pinger.cancel()
        if link.initialized:
            self.problem = link.failure
        else:
            self.problem = f"no MCP over {self._kind}: {link.failure or 'no answer'}"
            logger.info("board %s: %s", self.url, self.problem)
        return link.initialized

    @contextlib.asynccontextmanager
    async def _transport(self, target: Target) -> AsyncIterator[tuple[Any, Any]]:
        http = BoardHttp(token=self._token, host=target.host,
                         max_bytes=self._config.boards_max_message_bytes)  # fmt: skip
        if self._kind == SSE:
            async with sse_client(target.url, httpx_client_factory=http) as streams:
                yield streams
            return
        async with (
            http() as client,
            streamable_http_client(
                target.url, http_client=client, max_sse_event_size=http.max_bytes
            ) as streams,
        ):
            yield streams

    async def _ping(self, link: BoardLink) -> None:
        while True:
            await asyncio.sleep(self._config.boards_ping_interval)
            if not await link.ping():
                return


def _reason(exc: BaseException) -> str:
    """The innermost cause of a failed attempt (the SDK's task groups wrap it)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
