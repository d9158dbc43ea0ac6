"""``DeviceProtocol``: the gateway's side of one device session, with no I/O.

Text frames go in with ``receive_text()``; events come out of ``events_received()`` and frames to
send out of ``data_to_send()``. The gateway is the MCP *client*: it discovers the device's tools and
calls them (docs/protocol.md §4).

Rule: every change of ``state`` happens in this module, through the ``state`` setter, which checks
``states.TRANSITIONS``::

    CONNECTED --hello / start_discovery() / hello deadline--> INITIALIZING
    INITIALIZING --initialize reply--> LISTING --last page--> READY
    READY --notifications/tools/list_changed / relist deadline--> LISTING
    (any state) --close() / discovery deadline--> CLOSED

The core owns the session's one deadline (``timing.Timing`` says what it means in each state):
the I/O layer arms a timer for ``timer`` and calls ``handle_timer()`` when it fires. Listings
start at least ``relist_interval`` apart, however often the device says its tools changed.

Calls are bounded per session (``pending.Pending`` keeps the request ids and the calls); beyond
the bound ``call_tool()`` raises ``DeviceBusy``. ``forget()`` drops a call: a waiting one silently,
a sent one with ``notifications/cancelled`` so that the device can stop it (stock firmware drops
every notification, docs/protocol.md §4; our firmware cancels the tool's task). ``outgoing`` builds
the messages, ``outbox.Outbox`` holds what awaits the I/O layer; ``device_log`` the events."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gateway.errors import DeviceBusy, InvalidState, LocalProtocolError
from gateway.protocol import device_log, envelope, outgoing
from gateway.protocol.catalog import PageBook, ToolCatalog
from gateway.protocol.events import (
    DeviceGoodbye,
    DiscoveryTimedOut,
    Event,
    HelloReceived,
    MessageDropped,
    ToolsListed,
)
from gateway.protocol.jsonrpc import ErrorResponse, Notification, Request, Response, classify
from gateway.protocol.outbox import Logger, Outbox
from gateway.protocol.pending import Pending, Purpose, call_result
from gateway.protocol.states import TRANSITIONS, State
from gateway.protocol.timing import Timing

__all__ = ["DeviceProtocol", "State"]

JsonObject = dict[str, Any]

TOOLS_LIST_CHANGED = "notifications/tools/list_changed"
RELIST_INTERVAL = 0.25  # seconds between the starts of two listings of one session
_EXCERPT = 120


class DeviceProtocol:
    """The gateway's MCP-client side of one device session."""

    def __init__(
        self,
        device_id: str,
        *,
        session_id: str | None = None,
        transport: str = "websocket",
        client_info: JsonObject | None = None,
        vision: dict[str, str] | None = None,
        udp: dict[str, Any] | None = None,
        max_message_bytes: int = 65536,
        max_pages: int = 64,
        hello_timeout: float = 3.0,
        discovery_timeout: float = 15.0,
        relist_interval: float = RELIST_INTERVAL,
        max_calls_in_flight: int = 4,
        max_calls_queued: int = 32,
        request_ids: range | None = None,
        answer_hello: bool = True,
        pages: PageBook | None = None,
        clock: Callable[[], float] = time.monotonic,
        logger: Logger | None = None,
    ) -> None:
        """Start a session in state ``CONNECTED``.

        Args:
            device_id: the device's identity, for the I/O layer and logs.
            session_id: our session id; a fresh one when None.
            transport: the ``transport`` of our hello: ``"websocket"``, or ``"udp"`` over MQTT.
            client_info: the ``initialize`` ``clientInfo``; names this gateway when None.
            vision: ``{"url", "token"}``, sent as ``capabilities.vision`` (camera photo uploads).
            udp: over MQTT, the ``udp`` block of our hello (``envelope.check_udp_block``).
            max_message_bytes: the largest frame accepted from or sent to the device.
            max_pages: the most ``tools/list`` pages requested per listing.
            hello_timeout: seconds to wait for a hello before discovering anyway.
            discovery_timeout: seconds a discovery or listing may take, from its start.
            relist_interval: the fewest seconds from the start of one listing to the next.
            max_calls_in_flight: the most calls sent to the device and not yet answered (≥ 1).
            max_calls_queued: the most calls waiting for one of those slots (≥ 0).
            request_ids: the ids of our requests (1 up when None); beside a voice server,
                the range the MCP tap keeps for the gateway (docs/protocol.md §8).
            answer_hello: False when another server answers the device's hello (a proxied
                device's voice server): a hello then only starts discovery.
            pages: ``tools/list`` pages seen before, shared between sessions: a page found there
                is taken without parsing its frame (``ToolCatalog.stock_page``).
            clock: the time in seconds, for deadlines (the I/O layer's timer clock).
            logger: where to log; ``getLogger(__name__)`` when None.

        Raises:
            LocalProtocolError: ``session_id``, ``transport``, ``client_info``, ``vision`` or
                ``udp`` cannot be sent to a device.
        """
        self.device_id = device_id
        self.logger: Logger = logger if logger is not None else logging.getLogger(__name__)
        self._session_id = envelope.new_session_id() if session_id is None else session_id
        self._hello = envelope.server_hello(self._session_id, transport, udp)
        self._out = Outbox(self._session_id, self.logger)
        self.debug = self._out.debug
        self.transport = transport
        self._init = outgoing.initialize_params(client_info, vision)  # JSON text, sent as is
        self._max_bytes = max_message_bytes
        self._max_pages = max_pages
        self._timing = Timing(clock, hello_timeout, discovery_timeout, relist_interval)
        self._state = State.CONNECTED
        self._pending = Pending(max_calls_in_flight, max_calls_queued, request_ids)
        self._answer_hello = answer_hello
        self._pages = pages
        self._catalog: ToolCatalog | None = None  # only while listing: entries weigh a lot
        self._server_info: JsonObject | None = None

    # State machine.

    @property
    def state(self) -> State:
        """The session's current state."""
        return self._state

    @state.setter
    def state(self, new: State) -> None:
        if new not in TRANSITIONS[self._state]:
            raise InvalidState(f"no transition from {self._state.name} to {new.name}")
        if self.debug:
            self.logger.debug("= %s -> %s", self._state.name, new.name)
        self._state = new

    @property
    def session_id(self) -> str:
        """Our session id, sent in every frame."""
        return self._session_id

    @property
    def timer(self) -> float | None:
        """When ``handle_timer()`` must be called next (``clock`` time), or None."""
        return self._timing.deadline

    @property
    def pending_calls(self) -> frozenset[int]:
        """Ids of the ``tools/call`` requests sent and still waiting for a reply."""
        return self._pending.calls

    @property
    def waiting_calls(self) -> tuple[int, ...]:
        """Ids of the calls not sent yet, waiting for a free slot, oldest first."""
        return self._pending.waiting

    # Public API.

    def receive_text(self, text: str) -> None:
        """Digest one text frame from the device; never raises, whatever ``text`` holds."""
        if self._state is State.CLOSED:
            return
        if self.debug:
            self.logger.debug("< %s", text)
        if self._catalog is not None and self._on_stock_page(self._catalog, text):
            return
        message = self._decode(text)
        if message is None:
            return
        kind = message["type"]
        if kind == "hello":
            self._on_hello(message)
        elif kind == "mcp":
            self._on_mcp(message.get("payload"), (text, message.get("session_id")))
        elif kind == "goodbye":
            self._out.events.append(DeviceGoodbye())
        else:
            # docs/protocol.md §1.1: listen/abort/... belong to voice sessions, not to MCP.
            self._out.drop("unsupported message type", type=kind)

    def start_discovery(self) -> None:
        """Initialize and list tools without a hello (MQTT, hello timeout); only if CONNECTED."""
        if self._state is State.CONNECTED:
            self._start_discovery()

    def call_tool(self, name: str, arguments: JsonObject) -> int:
        """Queue a ``tools/call`` request.

        Args:
            name: the device's tool name.
            arguments: the tool's arguments.

        Returns:
            The request id; a ``CallSucceeded`` or ``CallFailed`` with this id follows. The
            request is queued in ``data_to_send()`` at once, or when a slot frees if
            ``max_calls_in_flight`` calls are running (``waiting_calls`` then holds it).

        Raises:
            InvalidState: the session is closed.
            LocalProtocolError: the request is not JSON or its frame exceeds the size limit.
            DeviceBusy: as many calls as allowed are running and waiting already.
        """
        if self._state is State.CLOSED:
            raise InvalidState("cannot call a tool on a closed session")
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            raise LocalProtocolError("tools/call needs a string name and an arguments object")
        busy = self._pending.busy()
        if busy is not None:
            raise DeviceBusy(self.device_id, busy)
        call_id = self._pending.new_id()
        try:
            frame = self._out.encode_mcp(outgoing.call_request(call_id, name, arguments))
        except (TypeError, ValueError, RecursionError) as exc:
            raise LocalProtocolError(f"tools/call arguments are not JSON: {exc}") from exc
        if envelope.too_large(frame, self._max_bytes):  # measured without encoding if it can be
            size = envelope.utf8_length(frame)
            raise LocalProtocolError(f"tools/call frame is {size} bytes, over {self._max_bytes}")
        if self._pending.add_call(call_id, frame):
            self._out.frame(frame)
        return call_id

    def forget(self, call_id: int, reason: str = "the caller stopped waiting") -> bool:
        """Stop waiting for ``call_id`` (timed out, or cancelled by its caller).

        A call still waiting for a slot is dropped unsent. A call sent already is cancelled on
        the device: ``notifications/cancelled`` with ``reason`` is queued, its slot goes to the
        oldest waiting call, and a late reply becomes ``MessageDropped``.

        Returns:
            True when the device is told to cancel (a frame is queued in ``data_to_send()``).
        """
        if not self._pending.forget(call_id):
            return False  # it waited unsent, or is answered, closed, unknown, or not a call
        # MCP cancellation: the device should stop the request and send no response for it.
        self._out.mcp(outgoing.cancellation(call_id, reason))
        self._send_waiting()
        return True

    def handle_timer(self) -> None:
        """Act on the deadline if it has come: discover, list a change held back, or give up."""
        if not self._timing.due():
            return
        if self._state is State.CONNECTED:
            self._start_discovery()
        elif self._state is State.READY:  # its deadline is set only while a change waits
            self._start_listing()
        else:  # INITIALIZING or LISTING (CLOSED has no deadline)
            self._out.events.append(DiscoveryTimedOut(self._timing.discovery_timeout))
            self.close()

    def close(self) -> None:
        """End the session; later input is ignored.

        Every ``tools/call`` still pending gets a ``CallFailed`` with ``closed=True``: those sent in
        id order, then those waiting in theirs.
        """
        if self._state is State.CLOSED:
            return
        self.state = State.CLOSED
        self._timing.deadline = None
        self._out.events.extend(self._pending.close())

    def events_received(self) -> list[Event]:
        """Return and forget the events produced since the last call."""
        return self._out.take_events()

    def data_to_send(self) -> list[str]:
        """Return and forget the frames queued since the last call, one text frame each."""
        return self._out.take_frames()

    # Incoming messages.

    def _decode(self, text: str) -> JsonObject | None:
        try:
            return envelope.decode(text, self._max_bytes)
        except envelope.MessageTooLarge as exc:
            self._out.drop(str(exc), chars=len(text))
        except envelope.MalformedMessage as exc:
            salvaged = envelope.salvage_error_reply(text)
            if salvaged is not None:
                self.logger.debug("salvaged an error reply with an unescaped message")
                return salvaged
            self._out.drop(str(exc), excerpt=text[:_EXCERPT])
        return None

    def _on_hello(self, hello: JsonObject) -> None:
        # docs/protocol.md §1: the device waits 10 s for our hello, and says hello again for
        # every conversation; each gets an answer, but only the first starts discovery.
        if self._answer_hello:
            self._out.frame(envelope.encode(self._hello))
        self._out.events.append(HelloReceived(hello))
        self.start_discovery()

    def _on_mcp(self, payload: object, frame: tuple[str, object]) -> None:
        try:
            message = classify(payload)
        except envelope.MalformedMessage as exc:
            self._out.drop(f"invalid JSON-RPC: {exc}")
            return
        if isinstance(message, Request):
            self._out.mcp(outgoing.answer(message))
        elif isinstance(message, Notification):
            self._on_notification(message)
        else:
            self._on_reply(message, frame)

    def _on_notification(self, notification: Notification) -> None:
        if notification.method == device_log.LOGGING_MESSAGE:  # an event of the device
            self._out.events.append(device_log.device_logged(notification.params))
        elif notification.method != TOOLS_LIST_CHANGED:
            self._out.drop("unsupported notification", method=notification.method)
        elif self._state is State.READY:
            if self._timing.relist_now():
                self._start_listing()
        elif self._state in (State.INITIALIZING, State.LISTING):
            # Coalesce: one more listing once the current discovery ends, however many arrive.
            self._timing.changed = True
        # CONNECTED: discovery has not started, and will list the tools when it does.

    def _on_reply(self, reply: Response | ErrorResponse, frame: tuple[str, object]) -> None:
        purpose = self._pending.answered(reply.id)
        if purpose is None:
            self._out.drop("reply to an unknown or forgotten request", id=reply.id)
        elif purpose is Purpose.CALL:
            assert isinstance(reply.id, int)  # Pending holds int ids only
            self._out.events.append(call_result(reply.id, reply))
            self._send_waiting()
        elif purpose is Purpose.INITIALIZE:
            self._on_initialize_reply(reply)
        else:
            self._on_list_reply(reply, frame)

    # Discovery.

    def _start_discovery(self) -> None:
        self.state = State.INITIALIZING
        self._timing.discovery_started()
        request_id = self._pending.request(Purpose.INITIALIZE)
        self._out.frame(outgoing.initialize_frame(self._out.mcp_head, request_id, self._init))

    def _on_initialize_reply(self, reply: Response | ErrorResponse) -> None:
        if isinstance(reply, ErrorResponse):
            # docs/protocol.md §4: initialize is optional; the tools may still be listed.
            self.logger.info("initialize failed (%s); listing tools anyway", reply.message)
        elif isinstance(reply.result, dict) and isinstance(reply.result.get("serverInfo"), dict):
            self._server_info = reply.result["serverInfo"]
        self._start_listing()

    def _start_listing(self) -> None:
        self._timing.listing_started(relisting=self._state is State.READY)
        self.state = State.LISTING
        self._catalog = ToolCatalog(self._max_pages, self._pages)
        self._request_page(self._catalog, None)

    def _request_page(self, catalog: ToolCatalog, cursor: str | None) -> None:
        catalog.request_id = self._pending.request(Purpose.LIST)
        self._out.frame(outgoing.list_frame(self._out.mcp_head, catalog.request_id, cursor))

    def _on_stock_page(self, catalog: ToolCatalog, text: str) -> bool:
        # In a storm of joins most pages are known: neither the frame nor the page is parsed.
        page = catalog.stock_page(text, self._session_id, self._max_bytes)
        if page is None:
            return False  # any other frame: parsed whole, the normal way
        self._pending.answered(catalog.request_id)
        self._after_page(catalog, catalog.add_known(page))
        return True

    def _on_list_reply(self, reply: Response | ErrorResponse, frame: tuple[str, object]) -> None:
        catalog = self._catalog
        assert catalog is not None  # a tools/list id is pending only while listing
        raw = envelope.result_text(*frame, reply.id)  # names the page (ToolCatalog.digest)
        self._after_page(catalog, catalog.add_reply(reply, raw))

    def _after_page(self, catalog: ToolCatalog, dropped: list[MessageDropped]) -> None:
        self._out.events.extend(dropped)
        if catalog.next_cursor is not None:
            self._request_page(catalog, catalog.next_cursor)
            return
        self.state = State.READY
        self._timing.deadline = None
        self._catalog = None
        self._out.events.append(
            ToolsListed(catalog.tools, self._server_info, catalog.complete, catalog.digest)
        )
        if self._timing.changed and self._timing.relist_now():
            self._start_listing()

    # Outgoing messages.

    def _send_waiting(self) -> None:
        """Send the oldest waiting calls while slots are free."""
        for frame in self._pending.ready():
            self._out.frame(frame)
