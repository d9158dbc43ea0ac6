"""Listener limits: connection caps, request and authentication deadlines, accept errors.

This works at the transport, below any ASGI app. ``protocol_classes()`` returns subclasses of
uvicorn's h11 and websockets-sansio protocols, and each listener runs with its own pair. Every
connection those classes see takes a ``Slot`` from the listener's ``Guard``:

- **Caps.** Past ``max_connections`` on the listener, or past ``per_address`` connections from
  one remote address that have not authenticated, a new connection is aborted at once.
  Addresses in ``exempt`` have no per-address cap.
- **Handshake deadline (slow-loris).** Each request's headers must be complete within
  ``handshake_timeout`` of the connection opening, or of the previous response on a kept-alive
  connection. uvicorn itself has no such timeout.
- **Authentication deadline.** A connection that has not authenticated ``auth_timeout``
  seconds after it opened is aborted. It authenticates when the app accepts its WebSocket (the
  device route checks the device token first), or, on a listener with ``trust_requests``, with a
  request carrying ``bearer`` (every request when there is none: a loopback host listener).

Refusals and expiries are logged at a bounded rate (``ThrottledLog``). The embedded broker uses
the same ``Guard`` (``gateway.device_side.broker.connection``); running out of descriptors is
``gateway.net.descriptors``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import h11

from gateway.config import Config
from gateway.net.direct_http import DirectRequests
from gateway.net.expiries import Expiries, Expiry
from gateway.net.networks import Network, in_networks, networks
from gateway.net.throttled import ThrottledLog
from gateway.net.upgrade import DirectUpgrade, SocketRoutes
from gateway.net.websocket import LeanWebSocket

__all__ = ["Guard", "Guarded", "ListenerLimits", "Slot", "ThrottledLog", "in_networks",
           "listener_limits", "networks", "protocol_classes"]  # fmt: skip

logger = logging.getLogger(__name__)

_QUEUED_MESSAGES = 2  # a WebSocket's messages waiting for the app before it stops reading

Headers = Sequence[tuple[bytes, bytes]]
Deadlines = tuple["Expiries[Slot]", "Expiries[Slot]"]  # a listener's: handshake, authentication


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    """What one listener allows (``[limits]`` in the config)."""

    name: str
    max_connections: int
    per_address: int
    handshake_timeout: float
    auth_timeout: float
    exempt: tuple[Network, ...] = ()
    trust_requests: bool = False
    bearer: str | None = None
    # A dashboard session cookie (given a Cookie header's value) and an app's OAuth access token
    # (given the token) authenticate a connection as the host token does, when live; requests
    # from trusted_peers (Home Assistant's ingress proxy) too.
    session: Callable[[bytes], bool] | None = None
    app_token: Callable[[bytes], bool] | None = None
    trusted_peers: tuple[Network, ...] = ()

    def trusts(self, headers: Headers, peer: str = "") -> bool:
        """Does a request with ``headers`` from ``peer`` authenticate its connection?"""
        if not self.trust_requests:
            return False
        if self.bearer is None or in_networks(peer, self.trusted_peers):
            return True
        expected = self.bearer.encode()
        for name, value in headers:
            name = name.lower()
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                token = value[7:].strip()
                if hmac.compare_digest(token, expected) or (
                    self.app_token and self.app_token(token)
                ):
                    return True
            elif name == b"cookie" and self.session is not None and self.session(value):
                return True
        return False


def listener_limits(config: Config, listener: str) -> ListenerLimits:
    """The limits of the ``device`` or ``host`` listener, or of the embedded broker (``mqtt``)."""
    host = listener == "host"
    return ListenerLimits(
        name=listener,
        max_connections=config.limits_host_connections
        if host
        else config.limits_device_connections,
        per_address=config.limits_per_address,
        handshake_timeout=config.limits_handshake_timeout,
        auth_timeout=config.limits_auth_timeout,
        exempt=networks(config.limits_exempt_addresses),
        # Devices authenticate by their WebSocket being accepted (or their MQTT CONNECT); host
        # requests by the host token.
        trust_requests=host,
        bearer=config.host_token if host else None,
        trusted_peers=networks(config.host_ingress_peers) if host else (),
    )


class Guard:
    """One listener's connection accounting: caps, deadlines, and the log of what it refused."""

    def __init__(self, limits: ListenerLimits, log: ThrottledLog | None = None) -> None:
        self.limits = limits
        self.connections = 0
        self.unauthenticated: dict[str, int] = {}  # remote address -> open, not authenticated
        self.refused: dict[str, int] = {}  # why (cap, per_address, handshake, auth) -> how many
        self._counted: dict[str, bool] = {}  # remote address -> not exempt from per_address
        self.log = log or ThrottledLog(logger)
        self._expiries: Deadlines | None = None

    def expiries(self, loop: asyncio.AbstractEventLoop) -> Deadlines:
        """The connections' handshake and authentication deadlines on ``loop``: one timer each
        for all of them, however many connections come and go (a host's, one per call)."""
        queues = self._expiries
        if queues is None or queues[0].loop is not loop:  # a guard outliving its loop (tests)
            limits = self.limits
            queues = self._expiries = (
                Expiries(loop, limits.handshake_timeout, _handshake_expired),
                Expiries(loop, limits.auth_timeout, _auth_expired),
            )
        return queues

    def admit(self, transport: asyncio.WriteTransport, deadlines: bool = True) -> Slot | None:
        """A slot for a new connection, or None after aborting it (over a cap).

        ``deadlines=False``: the caller keeps its own (the embedded broker's CONNECT deadline).
        """
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        limits = self.limits
        if self.connections >= limits.max_connections:
            self._refuse(transport, "cap", "at its cap of %d connections", limits.max_connections)
            return None
        counted = self._counted.get(address)
        if counted is None:  # worked out once per address: a host opens a connection per call
            if len(self._counted) >= 4096:
                self._counted.clear()
            counted = self._counted[address] = not in_networks(address, limits.exempt)
        if counted and self.unauthenticated.get(address, 0) >= limits.per_address:
            self._refuse(
                transport,
                "per_address",
                "%s already has %d connections that have not authenticated",
                address,
                limits.per_address,
            )
            return None
        return Slot(self, transport, address, counted, deadlines)

    def _refuse(
        self, transport: asyncio.WriteTransport, kind: str, why: str, *args: object
    ) -> None:
        transport.abort()
        self.refused[kind] = self.refused.get(kind, 0) + 1
        self.log.warning(kind, "%s listener: refused a connection: " + why, self.limits.name, *args)


def _handshake_expired(slot: Slot, due: float) -> None:
    slot.expire("handshake", "did not send a complete request within %g s")


def _auth_expired(slot: Slot, due: float) -> None:
    slot.expire("auth", "did not authenticate within %g s")


class Slot:
    """One connection's place in its listener: counted while open; its deadlines are entries in
    the listener's queues (``Guard.expiries``), not timers of its own."""

    __slots__ = ("_auth", "_counted", "_deadlines", "_handshake", "_open", "_transport",
                 "address", "authenticated", "guard")  # fmt: skip

    def __init__(
        self,
        guard: Guard,
        transport: asyncio.WriteTransport,
        address: str,
        counted: bool,
        deadlines: bool = True,
    ) -> None:
        self.guard, self.address = guard, address
        self.authenticated = False
        self._transport = transport
        self._counted = counted  # in guard.unauthenticated (exempt addresses are not)
        self._open = True
        guard.connections += 1
        if counted:
            guard.unauthenticated[address] = guard.unauthenticated.get(address, 0) + 1
        self._deadlines = guard.expiries(asyncio.get_running_loop())
        self._handshake: Expiry[Slot] | None = None  # request headers are due by then
        self._auth: Expiry[Slot] | None = None  # it must have authenticated by then
        if deadlines:
            self._auth = self._deadlines[1].start(self)
            self.awaiting_request()

    def awaiting_request(self) -> None:
        """The connection waits for a request's headers: start the handshake deadline."""
        if self._open and self._handshake is None:
            self._handshake = self._deadlines[0].start(self)

    def request_started(self, headers: Headers | None = None) -> None:
        """A request's headers are complete; they may authenticate the connection."""
        self._end_handshake()
        if headers is not None and not self.authenticated:
            if self.guard.limits.trusts(headers, self.address):
                self.authenticate()

    def authenticate(self) -> None:
        """The app accepted the connection: no authentication deadline, no per-address count."""
        self.authenticated = True
        self._end_auth()
        self._uncount()

    def release(self) -> None:
        """The connection closed (idempotent)."""
        if not self._open:
            return
        self._open = False
        self._end_handshake()
        self._end_auth()
        self.guard.connections -= 1
        self._uncount()

    def _end_handshake(self) -> None:
        entry, self._handshake = self._handshake, None
        if entry is not None:
            self._deadlines[0].end(entry)

    def _end_auth(self) -> None:
        entry, self._auth = self._auth, None
        if entry is not None:
            self._deadlines[1].end(entry)

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            table = self.guard.unauthenticated
            table[self.address] -= 1
            if not table[self.address]:
                del table[self.address]

    def expire(self, kind: str, why: str) -> None:
        """Its ``kind`` deadline passed: close the connection, and say why (rate-limited)."""
        if kind == "handshake":
            self._handshake = None
        else:
            self._auth = None
        guard = self.guard
        limits = guard.limits
        guard.refused[kind] = guard.refused.get(kind, 0) + 1
        seconds = limits.handshake_timeout if kind == "handshake" else limits.auth_timeout
        guard.log.warning(kind, "%s listener: closed a connection from %s: it " + why,
                          limits.name, self.address or "?", seconds)  # fmt: skip
        self._transport.abort()  # close() would wait for a peer that may never read
        self.release()


class Guarded:
    """A WebSocket protocol that takes over its connection's slot from the h11 protocol; it
    authenticates the slot once accepted and releases it once the connection is lost."""

    __slots__ = ()
    slot: Slot | None


class _GuardedHttp(DirectUpgrade):
    """uvicorn's h11 protocol (a WebSocket handshake parsed once), reporting its connection's
    life to ``guard``."""

    guard: ClassVar[Guard]
    _slot: Slot | None = None
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Take a slot, or refuse the connection before uvicorn sees it."""
        self._slot = self.guard.admit(transport)
        if self._slot is None:
            self._refused = True
            return
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        """Give the slot back."""
        if self._refused:
            return
        if self._slot is not None:
            self._slot.release()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        """Parse what arrived, then follow whether the connection waits for request headers."""
        super().handle_events()
        self._follow()

    def on_response_complete(self) -> None:
        """A response went out: on a kept-alive connection the next request is awaited."""
        super().on_response_complete()
        self._follow()

    def head_received(self) -> None:
        """A request read below h11: its headers came in time, as h11's would."""
        if self._slot is not None:
            self._slot.request_started()

    def upgrade(self, request: bytes) -> asyncio.Protocol:
        """Hand the slot over to the WebSocket protocol that takes the transport."""
        slot, self._slot = self._slot, None
        if slot is not None:
            slot.request_started()
        protocol = super().upgrade(request)
        if slot is not None and isinstance(protocol, Guarded):
            protocol.slot = slot
        return protocol

    def _follow(self) -> None:
        slot = self._slot
        if slot is None or self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:
            slot.awaiting_request()
        else:
            slot.request_started(self.headers)


class _GuardedWebSocket(LeanWebSocket, Guarded):
    """uvicorn's websockets-sansio protocol (made lean); an accepted WebSocket authenticates its
    slot."""

    slot: Slot | None = None

    def send_receive_event_to_app(self) -> None:
        """Queue a message for the app; stop reading only once the app falls behind.

        uvicorn stops reading after every message and starts again when the app takes it: two
        epoll changes per frame, 9% of a storm of joins. Reading stops here once
        ``_QUEUED_MESSAGES`` wait (the app is behind), so at most one more message than before
        waits in memory; uvicorn's ``receive`` starts reading again when the queue is empty.
        """
        paused, self.read_paused = self.read_paused, True  # keeps uvicorn from pausing
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = paused
        if not paused and self.queue.qsize() >= _QUEUED_MESSAGES:
            self.read_paused = True
            self.transport.pause_reading()

    def start_keepalive(self) -> None:
        """Called once the app accepted the WebSocket (uvicorn sends 101 just before)."""
        super().start_keepalive()
        if self.slot is not None:
            self.slot.authenticate()

    def connection_lost(self, exc: Exception | None) -> None:
        """Give the slot back."""
        super().connection_lost(exc)
        if self.slot is not None:
            self.slot.release()


def protocol_classes(
    guard: Guard, sockets: SocketRoutes | None = None, requests: DirectRequests | None = None
) -> tuple[type[asyncio.Protocol], type[asyncio.Protocol]]:
    """uvicorn's ``http`` and ``ws`` protocol classes for a listener guarded by ``guard``;
    ``sockets``: the WebSocket paths it serves below ASGI (their protocols are ``Guarded``);
    ``requests``: the POST targets it answers below ASGI (their requests never authenticate
    the connection: for the device listener, where none does)."""

    class Http(_GuardedHttp):
        pass

    Http.guard = guard
    Http.sockets = sockets
    Http.requests = requests
    return Http, _GuardedWebSocket
