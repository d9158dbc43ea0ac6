"""Tests for gateway.cli.tables: what `devices` and `devices show` print."""

from __future__ import annotations

from gateway.cli.tables import device_table, shorten, tool_table


def test_no_devices_is_one_line() -> None:
    """An empty gateway says so rather than printing a lone header."""
    assert device_table([]) == ["no devices yet"]


def test_descriptions_are_one_line_and_cut_with_an_ellipsis() -> None:
    """Line breaks and runs of spaces fold; a long text ends in "..." within the width."""
    assert shorten("Set\n  the volume.") == "Set the volume."
    cut = shorten("word " * 30, width=20)
    assert len(cut) <= 20 and cut.endswith("...")


def test_a_pending_device_without_tools_shows_its_state_and_rejected_tools() -> None:
    """A pending device's line says so; tools the gateway rejected are listed with why."""
    summary = {"device": "desk", "id": "aa:01", "online": False, "status": "pending",
               "board": None, "firmware": None, "tools": "0 tools for hosts, 0 user-only",
               "rejected": [{"tool": "bad name", "reason": "invalid name"}]}  # fmt: skip
    assert tool_table(summary, []) == [
        "desk (aa:01): offline, pending, board -, firmware -",
        "0 tools for hosts, 0 user-only",
        "rejected bad name: invalid name",
    ]
