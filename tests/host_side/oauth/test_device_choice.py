"""The owner's choice of an app's devices, as the consent form and Connected apps send it."""

from __future__ import annotations

import pytest
from starlette.datastructures import FormData

from gateway.host_side.oauth.device_choice import MAX_PATTERNS, chosen_devices, patterns


def test_all_devices_unless_some_are_chosen_and_a_tick_always_limits() -> None:
    """ "All devices" alone is None; ticked ids and typed globs are the list, even when the
    owner left "All devices" selected (the narrower reading)."""
    assert chosen_devices(FormData([("devices", "all"), ("device_globs", "")])) is None
    some = FormData([("devices", "some"), ("device", "aa:01"), ("device_globs", "kitchen*, b")])
    assert chosen_devices(some) == ("aa:01", "kitchen*", "b")
    assert chosen_devices(FormData([("devices", "all"), ("device", "aa:01")])) == ("aa:01",)


def test_nothing_chosen_or_too_much_is_refused_with_words() -> None:
    """ "Only these" with none is refused (the page says so); so are too many or odd ones."""
    with pytest.raises(ValueError, match="at least one device"):
        chosen_devices(FormData([("devices", "some")]))
    with pytest.raises(ValueError, match="more than"):
        patterns([f"d{n}" for n in range(MAX_PATTERNS + 1)])
    with pytest.raises(ValueError, match="string"):
        patterns([3])
    assert patterns(["a", " a ", "b"]) == ("a", "b")
