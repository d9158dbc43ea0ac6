"""Where a device session stands, and the moves ``DeviceProtocol`` may make between states.

The table is the state machine's one home: ``DeviceProtocol``'s ``state`` setter checks every
change against ``TRANSITIONS`` (the diagram is in ``gateway.protocol.device``).
"""

from __future__ import annotations

import enum

__all__ = ["TRANSITIONS", "State"]


class State(enum.IntEnum):
    """Where a device session stands."""

    CONNECTED = 0
    INITIALIZING = 1
    LISTING = 2
    READY = 3
    CLOSED = 4


TRANSITIONS: dict[State, frozenset[State]] = {
    State.CONNECTED: frozenset({State.INITIALIZING, State.CLOSED}),
    State.INITIALIZING: frozenset({State.LISTING, State.CLOSED}),
    State.LISTING: frozenset({State.READY, State.CLOSED}),
    State.READY: frozenset({State.LISTING, State.CLOSED}),
    State.CLOSED: frozenset(),
}
