"""Tests for gateway.devices.rates: sliding windows per caller, device, tool and rule."""

from __future__ import annotations

from gateway.devices.rates import Rates

RELAY = "self.relay.set_state"


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def test_a_window_never_lets_more_than_its_calls_through() -> None:
    """3/minute: a fourth call within a minute of the first waits until that minute is over,
    and a refused call is not counted."""
    clock = Clock()
    rates = Rates(clock)
    rules = {"relay.*": (3, "minute")}
    for step in (0, 20, 20):
        clock.now += step
        assert rates.refusal("host", "dev", RELAY, rules) is None
    clock.now += 10  # 50 s after the first
    said = rates.refusal("host", "dev", RELAY, rules)
    assert said == f"{RELAY} is limited to 3 calls a minute for each caller; try again in 10 s"
    clock.now += 10
    assert rates.refusal("host", "dev", RELAY, rules) is None
    assert rates.refusal("host", "dev", RELAY, rules) is not None  # the second is 40 s old


def test_callers_devices_and_tools_are_counted_apart() -> None:
    """One caller over its rate stops no other caller, device or tool."""
    rates = Rates(Clock())
    rules = {"self.relay.*": (1, "hour")}
    assert rates.refusal("a", "dev", RELAY, rules) is None
    assert rates.refusal("a", "dev", RELAY, rules) == (
        f"{RELAY} is limited to 1 call an hour for each caller; try again in 60 min"
    )
    assert rates.refusal("b", "dev", RELAY, rules) is None
    assert rates.refusal("a", "other", RELAY, rules) is None
    assert rates.refusal("a", "dev", "self.relay.toggle", rules) is None
    assert rates.refusal("a", "dev", "self.lamp.on", rules) is None  # no rule matches


def test_every_matching_rule_applies_and_the_longest_wait_is_said() -> None:
    """A call must keep every rule; one refused by any is counted by none."""
    clock = Clock()
    rates = Rates(clock)
    rules = {"*": (2, "second"), "self.relay.*": (3, "minute")}
    assert rates.refusal("a", "dev", RELAY, rules) is None
    assert rates.refusal("a", "dev", RELAY, rules) is None
    assert "2 calls a second" in (rates.refusal("a", "dev", RELAY, rules) or "")
    clock.now += 1
    assert rates.refusal("a", "dev", RELAY, rules) is None
    clock.now += 1
    said = rates.refusal("a", "dev", RELAY, rules)
    assert said is not None and "3 calls a minute" in said and said.endswith("in 58 s")


def test_idle_counts_are_dropped_and_the_number_kept_is_bounded() -> None:
    """Counts whose window is over go; past ``max_buckets`` the one used longest ago goes."""
    clock = Clock()
    rates = Rates(clock, max_buckets=3)
    rules = {"*": (1, "minute")}
    for caller in "abcde":
        assert rates.refusal(caller, "dev", RELAY, rules) is None
    assert len(rates) == 3
    clock.now += 60
    assert rates.refusal("f", "dev", RELAY, rules) is None
    assert len(rates) == 1
