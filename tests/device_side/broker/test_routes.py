"""Routing: topic filters, the subscription table and retained messages."""

from __future__ import annotations

import pytest

from gateway.device_side.broker.routes import Routes, matches


class Sub:
    username = None

    def deliver(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        raise AssertionError("routes only say who; the broker delivers")


@pytest.mark.parametrize(
    ("topic_filter", "topic", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/+", "a/b", True),
        ("a/+", "a/b/c", False),
        ("a/#", "a", True),  # §4.7.1.2: # also matches the parent level
        ("a/#", "a/b/c", True),
        ("+/+", "a", False),
        ("#", "$SYS/x", False),  # §4.7.2
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a/b", "a/c", False),
    ],
)
def test_filters_match_as_the_standard_says(topic_filter: str, topic: str, expected: bool) -> None:
    """§4.7: + is one level, # the rest; $-topics are out of reach of leading wildcards."""
    assert matches(topic_filter, topic) is expected


def test_a_subscriber_gets_a_message_once_at_its_highest_qos() -> None:
    """Overlapping filters deliver once; exact filters are found without a scan."""
    routes, a, b = Routes(), Sub(), Sub()
    routes.subscribe(a, "x/1/down", 0)
    routes.subscribe(b, "x/+/down", 0)
    assert dict(routes.matching("x/1/down")) == {a: 0, b: 0}
    routes.subscribe(b, "x/#", 1)
    assert dict(routes.matching("x/1/down")) == {a: 0, b: 1}
    routes.unsubscribe(b, "x/+/down")
    routes.unsubscribe(b, "x/#")
    routes.unsubscribe(b, "never/subscribed")
    assert dict(routes.matching("x/1/down")) == {a: 0}
    assert dict(routes.matching("x/2/down")) == {}


def test_retained_messages_are_one_per_topic_and_empty_clears() -> None:
    """§3.3.1.3: the last retained message of a topic is kept; an empty one removes it."""
    routes = Routes()
    routes.keep("x/1/status", b"online", 1)
    routes.keep("x/1/status", b"offline", 0)
    routes.keep("x/2/status", b"online", 1)
    assert routes.retained_for("x/1/status") == [("x/1/status", b"offline", 0)]
    assert sorted(routes.retained_for("x/+/status")) == [
        ("x/1/status", b"offline", 0),
        ("x/2/status", b"online", 1),
    ]
    routes.keep("x/1/status", b"", 0)
    assert routes.retained_for("x/1/status") == []


def test_retained_messages_fit_their_budget_and_replacing_one_frees_its_room() -> None:
    """Topic and payload count; a replaced or cleared message gives its bytes back; one over
    the budget is not kept, and the one it replaces is gone."""
    routes = Routes(max_retained_bytes=30)
    assert routes.keep("x/1/status", b"online", 0)  # 16 bytes
    assert not routes.keep("x/2/status", b"offline", 0)  # 17 more: over 30
    assert routes.keep("x/1/status", b"offline", 0)  # replaces its own: 17
    assert routes.keep("x/1/status", b"", 0) and routes.retained_bytes == 0
    assert routes.keep("x/2/status", b"offline", 0)
    assert not routes.keep("x/2/status", b"o" * 30, 0)
    assert routes.retained == {} and routes.retained_bytes == 0
