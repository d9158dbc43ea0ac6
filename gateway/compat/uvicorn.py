"""uvicorn's internals: the protocol classes the listeners build on, below its public API.

Checked with uvicorn 0.54.0 (pyproject: ``uvicorn>=0.54,<0.55``).

uvicorn's public API is ``Config``, ``Server`` and ``run``; the protocol classes that serve each
connection are its own business. The listeners subclass them (``net/upgrade.py``,
``net/websocket.py``, ``net/limits.py``): a device's WebSocket handshake is handed over without
h11 parsing it, a listener counts and times its connections, and a WebSocket keeps less memory
and shares one keepalive timer. Those subclasses override the methods ``OVERRIDDEN`` names for
each class, and read the attributes uvicorn's ``__init__`` and ``connection_made`` set.
``ServerState`` is what uvicorn hands every protocol: the connections and tasks it closes and
awaits on shutdown, and the ``date`` and ``server`` headers of its responses.
"""

from __future__ import annotations

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from uvicorn.server import ServerState

__all__ = ["OVERRIDDEN", "H11Protocol", "ServerState", "WebSocketsSansIOProtocol"]

OVERRIDDEN: dict[type, frozenset[str]] = {
    # DirectUpgrade (upgrade.py) and the guarded listener's Http (limits.py)
    H11Protocol: frozenset(
        {
            "connection_lost",
            "connection_made",
            "data_received",
            "handle_events",
            "handle_websocket_upgrade",
            "on_response_complete",
        }
    ),
    # LeanWebSocket (websocket.py) and the guarded listener's WebSocket (limits.py)
    WebSocketsSansIOProtocol: frozenset(
        {
            "connection_lost",
            "handle_pong",
            "send",
            "send_receive_event_to_app",
            "start_keepalive",
            "stop_keepalive",
        }
    ),
    # Listener and its Config (listeners.py): public classes, methods of their own undocumented
    uvicorn.Server: frozenset({"capture_signals", "startup"}),
    uvicorn.Config: frozenset({"load"}),
}
"""The methods of each uvicorn class that the gateway's subclasses replace: a release that
renames one would leave the gateway's version uncalled, silently (``tests/test_compat.py``)."""
