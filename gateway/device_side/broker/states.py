"""A broker session's connection state, without a ``transitions`` machine per client.

amqtt 0.12 (pinned in pyproject.toml) gives every ``Session`` a ``transitions.Machine`` of its
own for three states (``new``, ``connected``, ``disconnected``) and two triggers: about 230
objects and 15 KB per MQTT client, a third of what an idle device costs the broker.
``SessionStates`` is the same state machine in one small object: the same triggers, the same
``MachineError`` for a ``connect`` while connected (amqtt's session take-over relies on it),
and the session's own enter hooks (they stamp its connect and disconnect times).
``install_session_states`` makes amqtt's sessions use it, once per process; the embedded broker
is the only user of amqtt's sessions in the gateway.
"""

from __future__ import annotations

from typing import Any

from amqtt.session import Session
from transitions import MachineError

__all__ = ["SessionStates", "install_session_states"]

# trigger -> the states it may leave; both triggers lead to the state of the same name
_SOURCES = {
    "connected": ("new", "disconnected"),
    "disconnected": ("new", "connected", "disconnected"),
}


class SessionStates:
    """One session's state: ``new`` -> ``connected`` <-> ``disconnected``."""

    __slots__ = ("_session", "state")

    def __init__(self, session: Any) -> None:
        self._session = session
        self.state = "new"

    def _to(self, state: str) -> bool:
        if self.state not in _SOURCES[state]:
            raise MachineError(f"Can't trigger event to {state} from state {self.state}!")
        self.state = state
        hook = getattr(self._session, f"_on_enter_{state}", None)
        if hook is not None:
            hook()
        return True

    def connect(self) -> bool:
        """``new`` or ``disconnected`` -> ``connected``; MachineError when connected."""
        return self._to("connected")

    def disconnect(self) -> bool:
        """Any state -> ``disconnected``."""
        return self._to("disconnected")

    def is_new(self) -> bool:
        return self.state == "new"

    def is_connected(self) -> bool:
        return self.state == "connected"

    def is_disconnected(self) -> bool:
        return self.state == "disconnected"


def _lean_init_states(session: Any) -> None:
    session.transitions = SessionStates(session)


def install_session_states() -> None:
    """Make amqtt's sessions keep their state in a ``SessionStates``."""
    if Session.__dict__.get("_init_states") is not _lean_init_states:
        setattr(Session, "_init_states", _lean_init_states)  # noqa: B010  # amqtt's method
