"""One live device: pumps its link through the sans-I/O protocol and turns events into effects.

``DeviceConnection.run()`` owns the link for its whole life: it feeds every incoming message to
``DeviceProtocol`` (from a ``PushLink``, the device WebSocket, in the loop turn it arrives: a
call's answer wakes its caller with no turn of this task in between), sends what the protocol
queues, hands listed catalogues to the registry, resolves the futures of pending calls, and
arms one timer for the protocol's deadline (the protocol decides what a deadline means:
discover without a hello, or give up discovery). When the link goes, the protocol fails every
pending call at once (DESIGN.md "Calls": a disconnect must not wait for the call timeout).

Calls under pressure: the protocol sends at most ``max_calls_in_flight`` calls at once, keeps up
to ``max_calls_queued`` more waiting, and refuses the rest at once (``DeviceBusy``); the waiting
happens inside ``call()``, so the caller's deadline covers it. A call that ends unanswered (its
deadline, or its caller cancelling) is forgotten in a ``finally``: the protocol queues
``notifications/cancelled`` and hands the slot to the next call, and a task of the connection
sends those frames, so that a cancelled caller never waits on the link.

A caller sends its own request only over a link that ``sends_whole`` (a frame is written whole
or not at all, even when the send is cancelled: the WebSocket) and when nothing else is being
sent; frames taken from the protocol stay in ``_unsent`` until written, so a caller cancelled
while its send waits (a full socket buffer) leaves them to the connection's task. Elsewhere the
task sends them: a cancelled send could have written a frame that would then go twice.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

from gateway.devices.events import EventStore
from gateway.devices.link import DeviceIdentity, DeviceLink, LinkClosed, PushLink, is_push
from gateway.devices.registry import DeviceRegistry
from gateway.errors import DeviceToolError, DeviceUnavailable, InvalidState
from gateway.protocol import (
    CallFailed,
    CallSucceeded,
    DeviceGoodbye,
    DeviceLogged,
    DeviceProtocol,
    DiscoveryTimedOut,
    Event,
    HelloReceived,
    MessageDropped,
    State,
    ToolsListed,
)

__all__ = ["CallReport", "DeviceConnection", "reporting"]

logger = logging.getLogger(__name__)

JsonObject = dict[str, Any]


@dataclass(slots=True)
class CallReport:
    """What became of one call on the wire, for its audit record (see ``reporting()``)."""

    timeout: asyncio.Timeout | None = None
    """The caller's deadline, set by the caller: it tells a timeout from a cancellation."""
    unsent: bool = False
    """The call ended while still waiting for a free slot: the device never saw it."""
    cancel_sent: bool = False
    """The call ended unanswered and the device was told to cancel it."""


_report: ContextVar[CallReport | None] = ContextVar("gateway_call_report", default=None)


class reporting:  # noqa: N801 -- used as a function: ``with reporting() as report``
    """Collect in a ``CallReport`` what the one ``DeviceConnection.call()`` awaited in the block
    does on the wire.

    A context variable carries the report past the registry's ``DeviceSession`` seam, which
    knows nothing of it (a session that is not a ``DeviceConnection`` leaves it blank). A class,
    not a generator: every call enters one.
    """

    __slots__ = ("_token",)
    _token: Token[CallReport | None]

    def __enter__(self) -> CallReport:
        report = CallReport()
        self._token = _report.set(report)
        return report

    def __exit__(self, *exc: object) -> None:
        _report.reset(self._token)


class DeviceConnection:
    """A connected device: implements the registry's ``DeviceSession``.

    The protocol must read the running loop's clock (``clock=loop.time``): its ``timer`` is
    armed with ``loop.call_at``.
    """

    def __init__(
        self,
        link: DeviceLink,
        identity: DeviceIdentity,
        registry: DeviceRegistry,
        protocol: DeviceProtocol,
        events: EventStore | None = None,
    ) -> None:
        self.identity = identity
        self._events = events  # where the device's events go (none: dropped)
        self._link = link
        self._registry = registry
        self._protocol = protocol
        self._futures: dict[int, asyncio.Future[JsonObject]] = {}
        self._send_lock = asyncio.Lock()
        # Taken from the protocol, not written yet: rarely more than a frame, and a deque would
        # cost an idle device 600 bytes.
        self._unsent: list[str] = []
        self._caller_sends = link.sends_whole
        # A PushLink: takes each message in the turn it came, and writes without waiting.
        self._push: PushLink | None = link if is_push(link) else None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_task: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None

    @property
    def _log(self) -> logging.LoggerAdapter[logging.Logger]:
        # Made when needed: a connection logs rarely, and an idle fleet holds thousands.
        return logging.LoggerAdapter(logger, {"device_id": self.identity.device_id})

    async def run(self) -> None:
        """Serve the device until its link closes (or ``aclose`` is called)."""
        replaced = self._registry.connect(
            self.identity.device_id,
            self,
            client_id=self.identity.client_id,
            transport=self.identity.transport,
        )
        if replaced is not None:  # the device reconnected before we saw the old link drop
            await replaced.aclose()
        failed = False
        try:
            self._arm()  # MQTT: a deadline already due, discovery starts at once
            if self._push is not None:  # each message in the turn it came
                await self._push.deliver(self._received)
            else:
                await self._pull()
        except (LinkClosed, DeviceUnavailable):
            pass
        except Exception:
            failed = True
            raise
        finally:
            if self._timer is not None:
                self._timer.cancel()
            self._protocol.close()
            self._handle(self._protocol.events_received())
            self._registry.disconnect(self.identity.device_id, self)
            # A failure ends the link as failed (the WebSocket's 1011), not as a normal close:
            # the device must not take it for one, and the caller logs it (a pulled link's,
            # as a pushed one's, which ``deliver`` failed already).
            fail = self._link.fail if failed else None
            if fail is not None:
                fail()
            else:
                await self._link.aclose()

    async def call(self, tool: str, arguments: JsonObject) -> JsonObject:
        """Call ``tool`` on the device; return its result.

        The call may first wait for a free slot. The caller bounds the whole wait
        (``asyncio.timeout``); a call cancelled that way, or by its caller, is forgotten: the
        device is told to cancel it if it was sent, and a late answer is dropped.

        Raises:
            DeviceBusy: as many calls as allowed are running and waiting already.
            DeviceUnavailable: the link is gone or goes away before the answer.
            DeviceToolError: the device answered with an error.
        """
        try:
            call_id = self._protocol.call_tool(tool, arguments)
        except InvalidState:  # the link went; run() is about to unregister us
            raise DeviceUnavailable(self.identity.device_id, "device disconnected") from None
        future: asyncio.Future[JsonObject] = asyncio.get_running_loop().create_future()
        self._futures[call_id] = future
        try:
            if self._caller_sends and self._sender is None and not self._send_lock.locked():
                if self._push is not None:  # no task, lock or await per call: it goes now
                    self._write_now(self._push)
                else:
                    try:  # no task per call: the frame goes now, in order (nothing else sends)
                        await self._flush()
                    except DeviceUnavailable:
                        pass  # the link went: the protocol failed the call; the future says so
            else:
                self._send_soon()
            return await future
        finally:
            if self._futures.pop(call_id, None) is not None:  # no answer: timeout or cancel
                self._forget(call_id)
            if self._unsent:  # its send was cut short: what it had taken goes from the task
                self._send_soon()

    async def send_frame(self, text: str) -> None:
        """Send ``text``, a message of the device protocol beside MCP (the stock ``alert``),
        in order with the protocol's frames and as they are sent (``call()``).

        Raises:
            DeviceUnavailable: the link is gone.
        """
        if self._protocol.state is State.CLOSED:
            raise DeviceUnavailable(self.identity.device_id, "device disconnected")
        self._unsent.append(text)
        if self._caller_sends and self._sender is None and not self._send_lock.locked():
            if self._push is not None:
                self._write_now(self._push)
            else:
                await self._flush()
        else:
            self._send_soon()

    async def aclose(self) -> None:
        """Close the link; ``run`` then cleans up."""
        await self._link.aclose()

    # --- internals -------------------------------------------------------------------------

    async def _pull(self) -> None:
        async for text in self._link:
            self._protocol.receive_text(text)
            del text  # not kept alive while the device is idle: a tools/list page is 8 KB
            self._handle(self._protocol.events_received())
            self._unsent.extend(self._protocol.data_to_send())  # queued in order
            if self._unsent:  # a call's reply, the most common frame, wants no answer
                await self._flush()
            self._arm()

    def _received(self, text: str) -> None:
        """A message from a ``PushLink``, in the loop turn it arrived."""
        self._protocol.receive_text(text)
        del text
        self._handle(self._protocol.events_received())
        self._write_now(self._push)
        self._arm()

    def _write_now(self, link: PushLink | None) -> None:
        """Write the protocol's queued frames to the ``PushLink`` in one write, now, when nothing
        else is sending (so in order); what the socket cannot take goes from the sender task."""
        unsent = self._unsent
        unsent.extend(self._protocol.data_to_send())
        if unsent and link is not None and self._sender is None and not self._send_lock.locked():
            del unsent[: link.write_now(unsent)]
        if unsent:  # the socket is full (or gone): the sender task waits for it
            self._send_soon()

    async def _flush(self) -> int:
        """Send every frame the protocol has queued; return how many."""
        # The lock keeps frames in the order the protocol queued them across concurrent senders.
        async with self._send_lock:
            unsent = self._unsent
            unsent.extend(self._protocol.data_to_send())
            sent = 0
            while unsent:
                try:
                    await self._link.send(unsent[0])
                except LinkClosed:
                    unsent.clear()
                    self._protocol.close()
                    self._handle(self._protocol.events_received())
                    raise DeviceUnavailable(
                        self.identity.device_id, "device disconnected"
                    ) from None
                del unsent[0]  # written (a cancelled send leaves it for the next flush)
                sent += 1
            return sent

    def _send_soon(self) -> None:
        """Have the sender task send what the protocol queued (start it if it is idle)."""
        if self._sender is None:
            self._sender = asyncio.create_task(
                self._send_all(), name=f"gateway.device[{self.identity.device_id}].send"
            )

    async def _send_all(self) -> None:
        try:
            while await self._flush():  # until a pass finds nothing: frames queued meanwhile go too
                pass
        except DeviceUnavailable:
            pass  # the protocol is closed: every call still pending has failed with it
        finally:
            self._sender = None

    def _forget(self, call_id: int) -> None:
        """Forget a call that ended unanswered; tell the device if it has the call.

        Runs in the ``finally`` of a cancelled ``call()``: it must not wait, so the frames it
        queues go out from the sender task.
        """
        report = _report.get()
        timed_out = report is not None and report.timeout is not None and report.timeout.expired()
        unsent = call_id in self._protocol.waiting_calls
        told = self._protocol.forget(
            call_id, "timed out" if timed_out else "cancelled by the caller"
        )
        if report is not None:
            report.unsent, report.cancel_sent = unsent, told
        if told:  # notifications/cancelled, and the next waiting call now that a slot is free
            self._send_soon()

    def _arm(self) -> None:
        """Keep one timer armed for the protocol's deadline."""
        deadline = self._protocol.timer
        if self._timer is not None:
            if deadline is not None and self._timer.when() == deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._protocol.handle_timer()
        self._handle(self._protocol.events_received())
        # Sending is async: a task sends what the deadline queued (initialize), or closes.
        self._timer_task = asyncio.create_task(
            self._after_timer(), name=f"gateway.device[{self.identity.device_id}].timer"
        )
        self._arm()

    async def _after_timer(self) -> None:
        try:
            await self._flush()
            if self._protocol.state is State.CLOSED:  # discovery gave up: end the session
                await self._link.aclose()
        except DeviceUnavailable:
            pass
        finally:
            if self._timer_task is asyncio.current_task():  # kept only while it runs
                self._timer_task = None

    def _handle(self, events: list[Event]) -> None:
        dropped: MessageDropped | None = None  # the last, which says why a listing stopped
        for event in events:
            if isinstance(event, CallSucceeded | CallFailed):
                self._settle(event)
            elif isinstance(event, ToolsListed):
                self._listed(event, dropped)
            elif isinstance(event, DeviceLogged):
                if self._events is not None:
                    self._events.add(self.identity.device_id, event)
            elif isinstance(event, DiscoveryTimedOut):
                self._log.warning("no tool list within %g s; closing the connection", event.seconds)
            elif isinstance(event, HelloReceived):
                self._log.debug("hello: %s", event.hello)
            elif isinstance(event, DeviceGoodbye):
                self._log.info("device said goodbye")
            elif isinstance(event, MessageDropped):
                dropped = event
                self._log.debug("dropped: %s %s", event.reason, event.detail)

    def _listed(self, event: ToolsListed, dropped: MessageDropped | None) -> None:
        """Take a listing (the registry keeps a known catalogue against one that stopped
        early); say why one stopped early, and what was kept."""
        taken = self._registry.set_catalogue(self.identity.device_id, event.tools,
                                             event.server_info, event.digest,
                                             complete=event.complete)  # fmt: skip
        if not event.complete:
            why = dropped.reason if dropped is not None else "no reason given"
            kept = "taking what it listed" if taken else "keeping the catalogue it listed before"
            self._log.info("tools/list stopped early (%s) after %d tools; %s until a complete "
                           "listing", why, len(event.tools), kept)  # fmt: skip

    def _settle(self, event: CallSucceeded | CallFailed) -> None:
        future = self._futures.pop(event.call_id, None)
        if future is None or future.done():
            return
        device_id = self.identity.device_id
        if isinstance(event, CallSucceeded):
            future.set_result(event.result)
        elif event.closed:
            future.set_exception(DeviceUnavailable(device_id, event.message))
        else:
            future.set_exception(DeviceToolError(device_id, event.message, event.code))
