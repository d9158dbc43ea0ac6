"""Tests for gateway.protocol.pending: a session's request ids, reply routing and call slots."""

from __future__ import annotations

from gateway.protocol.events import CallFailed
from gateway.protocol.pending import FIRST_REQUEST_ID, Pending, Purpose


def test_ids_start_at_the_first_request_id_and_route_replies() -> None:
    """Ids count up from FIRST_REQUEST_ID; a reply settles its request once, by purpose."""
    pending = Pending(max_in_flight=1, max_queued=0)
    first = pending.request(Purpose.INITIALIZE)
    assert first == FIRST_REQUEST_ID
    assert pending.request(Purpose.LIST) == first + 1
    assert pending.answered(first) is Purpose.INITIALIZE
    assert pending.answered(first) is None  # settled already
    assert pending.answered(str(first + 1)) is None  # only int ids are ours


def test_calls_beyond_the_slots_wait_and_go_oldest_first() -> None:
    """A full slot makes calls wait; an answer frees it for the oldest; beyond the line, busy."""
    pending = Pending(max_in_flight=1, max_queued=2)
    ids = [pending.new_id() for _ in range(3)]
    sent_now = [pending.add_call(call_id, f"frame {i}") for i, call_id in enumerate(ids)]
    assert sent_now == [True, False, False]
    assert pending.busy() == "1 call running and 2 waiting"
    assert pending.waiting == (ids[1], ids[2]) and pending.calls == {ids[0]}
    assert pending.answered(ids[0]) is Purpose.CALL
    assert pending.ready() == ["frame 1"]
    assert pending.busy() is None


def test_forget_tells_whether_the_device_must_be_told() -> None:
    """A waiting call is dropped quietly; a sent one must be cancelled; others are not calls."""
    pending = Pending(max_in_flight=1, max_queued=1)
    listing = pending.request(Purpose.LIST)
    sent, waiting = pending.new_id(), pending.new_id()
    pending.add_call(sent, "sent")
    pending.add_call(waiting, "waiting")
    assert pending.forget(waiting) is False and pending.waiting == ()
    assert pending.forget(listing) is False
    assert pending.forget(sent) is True and pending.calls == frozenset()


def test_close_fails_sent_calls_then_waiting_ones() -> None:
    """close() fails the calls sent in id order, then the waiting ones, and forgets them all."""
    pending = Pending(max_in_flight=2, max_queued=1)
    ids = [pending.new_id() for _ in range(3)]
    for call_id in reversed(ids):
        pending.add_call(call_id, "frame")
    failed = pending.close()
    assert [event.call_id for event in failed] == [ids[1], ids[2], ids[0]]
    assert all(isinstance(event, CallFailed) and event.closed for event in failed)
    assert pending.calls == frozenset() and pending.waiting == ()
