"""Tests for gateway.devices.confirmations: the waiting list over a real CallRouter and
DeviceConnection on an in-memory link (the MCP surfaces: tests/e2e/test_confirmations.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.config import DeviceOptions
from gateway.devices.audit import Actor
from gateway.devices.confirm_rules import unmatched
from gateway.devices.confirmations import Confirmations, UnknownCall, in_words
from gateway.errors import CallRejected, StorageUnavailable
from tests.conftest import bound, make_config
from tests.devices.test_calls import lamp
from tests.devices.test_connection import DEVICE, connected

pytestmark = pytest.mark.anyio

CONFIRMED = {DEVICE: DeviceOptions(confirm=("lamp.*",))}


def test_arguments_read_as_words() -> None:
    """What the person is asked names each argument and its JSON value."""
    assert in_words({}) == "no arguments"
    assert in_words({"volume": 30, "room": "küche"}) == 'volume = 30, room = "küche"'


def test_globs_naming_no_tool_are_found() -> None:
    """With or without ``self.``, as allow/deny match; a glob naming nothing is returned."""
    names = ["self.lamp.turn_on", "self.door.unlock"]
    assert unmatched(["lamp.*", "self.door.*", "self.dor.*"], names) == ["self.dor.*"]


async def test_a_decision_is_taken_once_and_names_what_became(tmp_path: Path) -> None:
    """Deny refuses the call before the device; a second decision, or one for an unknown id,
    raises UnknownCall saying which it is."""
    config = make_config(tmp_path, devices=CONFIRMED)
    async with connected(tmp_path, config=config) as harness:
        await harness.discover()
        router = harness.stack.router
        confirmations = router.confirmations
        call = asyncio.create_task(router.call(lamp(harness), {}, caller="tester"))
        async with asyncio.timeout(bound(5)):
            while not confirmations.waiting():
                await confirmations.changed()
        [pending] = confirmations.waiting()
        assert pending.question.startswith("tester asks to call self.lamp.turn_on on device")
        confirmations.decide(pending.id, False, Actor("owner", "dashboard"))
        with pytest.raises(CallRejected, match="the owner denied it \\(dashboard"):
            await call
        with pytest.raises(UnknownCall, match="not waiting any more: denied by owner"):
            confirmations.decide(pending.id, True, Actor("owner", "cli"))
        with pytest.raises(UnknownCall, match="no call nope waits"):
            confirmations.decide("nope", True, Actor("owner", "cli"))


async def test_the_owner_s_choice_wins_over_the_globs_and_is_kept(tmp_path: Path) -> None:
    """Unticking a glob-named tool on the dashboard stops its confirmation; the choice is in
    confirm.json, read back by the next start; an unreadable file is never written over."""
    config = make_config(tmp_path, devices=CONFIRMED)
    async with connected(tmp_path, config=config) as harness:
        await harness.discover()
        tool = lamp(harness)
        confirmations = harness.stack.router.confirmations
        assert confirmations.wanted(tool)
        await confirmations.rules.choose(tool, False)
        assert not confirmations.wanted(tool)
        assert not Confirmations(config, harness.stack.audit).wanted(tool)
        (tmp_path / "confirm.json").write_text("{not json")
        broken = Confirmations(config, harness.stack.audit)
        assert broken.wanted(tool)  # the globs again: the file's choices cannot be read
        with pytest.raises(StorageUnavailable):
            await broken.rules.choose(tool, True)
        assert (tmp_path / "confirm.json").read_text() == "{not json"
