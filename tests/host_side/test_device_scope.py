"""A caller's devices: ids and globs on ids and names, any case; None is every device."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.host_side.device_scope import scope_of, scope_words


@dataclass
class Board:
    device_id: str
    alias: str


def test_a_scope_sees_its_ids_and_names_matched_by_glob_in_any_case() -> None:
    """A device id, or a glob on the id or the name, in any case; nothing else."""
    scope = scope_of(["AA:BB:CC:00:00:01", "Kitchen*"])
    assert scope is not None
    assert scope.sees(Board("aa:bb:cc:00:00:01", "porch"))
    assert scope.sees(Board("aa:bb:cc:00:00:09", "kitchen-lamp"))
    assert not scope.sees(Board("aa:bb:cc:00:00:02", "porch"))
    assert scope.sees(Board("kitchen-2", "hall"))  # a glob matches ids too
    assert scope_of(None) is None  # every device
    assert scope_of(["b", "a", "a"]) == scope_of(["A", "b"])  # one scope, one cached listing


def test_a_scope_in_words() -> None:
    """What the consent page and Connected apps say."""
    assert scope_words(None) == "all devices, present and future"
    assert scope_words(["sim-esp32_0002", "kitchen*"]) == (
        "only sim-esp32_0002, devices named like kitchen*"
    )
