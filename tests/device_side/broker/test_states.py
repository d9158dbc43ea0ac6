"""A broker session's state: one small object per client, not a transitions machine."""

from __future__ import annotations

import gc
from contextlib import AsyncExitStack

import pytest
from amqtt.session import Session
from transitions import Machine, MachineError

from gateway.device_side.broker.states import SessionStates, install_session_states
from tests.device_side.broker.test_embedded import TOKEN, broker, client, next_presence

pytestmark = pytest.mark.anyio


def _machines() -> int:
    gc.collect()  # those of earlier tests' sessions, if unreachable, are not counted
    return sum(isinstance(o, Machine) for o in gc.get_objects())


async def test_idle_mqtt_devices_hold_no_state_machine_each() -> None:
    """amqtt made a transitions machine (about 230 objects) per client session."""
    async with broker() as b, AsyncExitStack() as fleet:
        feed = b.presence()
        before = _machines()
        for n in range(20):
            await fleet.enter_async_context(client(b, f"aa:bb:cc:dd:ee:{n:02x}", TOKEN))
            await next_presence(feed)
        assert _machines() == before
        inner = b._broker
        assert inner is not None
        sessions = [session for session, _ in inner._sessions.values()]
        assert len(sessions) == 20
        assert all(isinstance(s.transitions, SessionStates) for s in sessions)
        assert all(s.transitions.is_connected() for s in sessions)
        feed.close()


def test_session_states_follow_amqtts_machine() -> None:
    """Same triggers, same refusal of a second connect, same time stamps as amqtt's machine."""
    install_session_states()
    session = Session()
    states = session.transitions
    assert isinstance(states, SessionStates) and states.is_new()
    with pytest.raises(AttributeError):
        states.other = 1  # type: ignore[attr-defined]  # slots: one small object
    assert states.connect() and states.is_connected()
    assert session.last_connect_time is not None and session.last_disconnect_time is None
    with pytest.raises(MachineError):
        states.connect()  # amqtt's take-over of a connected client id relies on this
    assert states.disconnect() and states.is_disconnected()
    assert states.state == "disconnected" and session.last_disconnect_time is not None
    assert states.disconnect() and states.connect()
    assert session.last_disconnect_time is None
    fresh = Session()
    assert fresh.transitions.disconnect() and fresh.transitions.state == "disconnected"
