"""Calls that wait for the owner's yes (issue 45): asked in the host by elicitation, in both
protocol eras, or waiting for `esp-mcp-gateway calls allow|deny` (the real CLI); refused on a
no, a timeout or a flood, and never seen by the simulated board unless allowed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp import Client

from gateway.app import Running
from gateway.config import DeviceOptions
from gateway.devices.confirmations import Confirmations
from gateway.simulator import SimulatedDevice
from tests.conftest import bound, gateway
from tests.e2e.helpers import listed_device
from tests.e2e.test_oauth_js import TS_CLIENT, node, npm_package
from tests.e2e.test_stdio_and_cli import cli, cli_env

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SIM_ID = "02:00:00:00:00:01"
VOLUME = "sim-esp32_0001_audio_speaker_set_volume"
LAMP = "sim-esp32_0001_lamp_turn_on"
CONFIRMED = {SIM_ID: DeviceOptions(confirm=("self.audio_speaker.set_*", "lamp.turn_on"))}
ERAS = ["legacy", "2026-07-28"]


@asynccontextmanager
async def confirming(tmp_path: Path, **overrides: Any) -> AsyncIterator[
    tuple[Running, SimulatedDevice]
]:  # fmt: skip
    """A gateway whose simulated board's volume and lamp calls wait for a yes."""
    async with gateway(tmp_path / "gw", devices=CONFIRMED, **overrides) as run:
        async with listed_device(run, SIM_ID) as dev:
            yield run, dev


class Answers:
    """An elicitation callback that answers every question with ``result``, and keeps them."""

    def __init__(self, result: types.ElicitResult) -> None:
        self.result = result
        self.asked: list[types.ElicitRequestParams] = []

    async def __call__(self, context: Any, params: types.ElicitRequestParams) -> Any:
        self.asked.append(params)
        return self.result


def yes() -> Answers:
    return Answers(types.ElicitResult(action="accept", content={"confirm": True}))


def confirm_records(run: Running) -> list[dict[str, Any]]:
    return run.gateway.audit.page(kind="confirm")["records"]


async def until_waiting(confirmations: Confirmations, count: int = 1) -> None:
    """Wait until ``count`` calls wait for the owner."""
    with anyio.fail_after(bound(10)):
        while len(confirmations.waiting()) < count:
            await confirmations.changed()


@pytest.mark.parametrize("mode", ERAS)
async def test_an_accepted_elicitation_lets_the_call_reach_the_board(
    tmp_path: Path, mode: str
) -> None:
    """The host is asked inside the call (who, which device and tool, the arguments in words);
    an explicit yes lets the board act, and the decision is audited."""
    answers = yes()
    async with confirming(tmp_path) as (run, dev):
        async with Client(run.mcp_url, mode=mode, elicitation_callback=answers) as client:
            result = await client.call_tool(VOLUME, {"volume": 30})
    assert not result.is_error, result
    assert dev.calls == [("self.audio_speaker.set_volume", {"volume": 30})]
    [question] = answers.asked
    assert "self.audio_speaker.set_volume on device sim-esp32_0001" in question.message
    assert "volume = 30" in question.message and "http:127.0.0.1" in question.message
    assert isinstance(question, types.ElicitRequestFormParams)
    assert question.requested_schema["properties"]["confirm"]["type"] == "boolean"
    [record] = confirm_records(run)
    assert record["outcome"] == "allowed" and record["channel"] == "elicitation"
    assert record["tool"] == "self.audio_speaker.set_volume" and record["waited_ms"] >= 0


@pytest.mark.parametrize("mode", ERAS)
@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (types.ElicitResult(action="decline"), "declined in the host"),
        (types.ElicitResult(action="cancel"), "cancelled"),
        (types.ElicitResult(action="accept", content={"confirm": False}), "not an explicit yes"),
        (types.ElicitResult(action="accept", content={"confirm": "yes"}), "not an explicit yes"),
    ],
    ids=["decline", "cancel", "accept-unticked", "accept-not-boolean"],
)
async def test_anything_but_an_explicit_yes_refuses_the_call_before_the_board(
    tmp_path: Path, mode: str, answer: types.ElicitResult, said: str
) -> None:
    """A decline, a cancel or an accept without the box ticked: isError naming the reason;
    the board never sees the call."""
    async with confirming(tmp_path) as (run, dev):
        async with Client(run.mcp_url, mode=mode, elicitation_callback=Answers(answer)) as client:
            result = await client.call_tool(LAMP, {})
    assert result.is_error
    assert said in result.content[0].text and "the device was not called" in result.content[0].text
    assert dev.calls == []
    [record] = confirm_records(run)
    assert record["outcome"] != "allowed" and record["channel"] == "elicitation"


async def test_a_tool_no_glob_names_is_called_unasked(tmp_path: Path) -> None:
    """Only the confirm-listed tools wait: another tool of the board is called at once."""
    answers = yes()
    async with confirming(tmp_path) as (run, dev):
        async with Client(run.mcp_url, mode="legacy", elicitation_callback=answers) as client:
            result = await client.call_tool("sim-esp32_0001_lamp_turn_off", {})
    assert not result.is_error and answers.asked == []
    assert dev.calls == [("self.lamp.turn_off", {})]


@pytest.mark.parametrize("mode", ERAS)
async def test_without_elicitation_the_call_waits_for_calls_allow(
    tmp_path: Path, mode: str
) -> None:
    """A host that cannot be asked: the call waits, `calls --json` lists it, `calls allow`
    releases it, and the host heard progress meanwhile."""
    async with confirming(tmp_path) as (run, dev):
        env = cli_env(tmp_path / "cli")
        url = f"http://127.0.0.1:{run.host_port}"
        confirmations = run.gateway.router.confirmations
        heard: list[str | None] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            heard.append(message)

        async with Client(run.mcp_url, mode=mode) as client, anyio.create_task_group() as tg:
            results: list[types.CallToolResult] = []

            async def call() -> None:
                results.append(
                    await client.call_tool(VOLUME, {"volume": 40}, progress_callback=progress)
                )

            tg.start_soon(call)
            await until_waiting(confirmations)
            code, out, err = await cli("calls", "--json", "--url", url, env=env)
            assert code == 0, err
            [listed] = json.loads(out)
            assert listed["device"] == "sim-esp32_0001" and listed["arguments"] == {"volume": 40}
            assert listed["tool"] == "self.audio_speaker.set_volume"
            assert listed["caller"].startswith("http:127.0.0.1") and listed["since"]
            assert dev.calls == []  # still waiting: the board has not seen it
            code, out, err = await cli("calls", "allow", listed["id"], "--url", url, env=env)
            assert code == 0, err
            assert f"allowed {listed['id']}" in out
        [result] = results
    assert not result.is_error, result
    assert dev.calls == [("self.audio_speaker.set_volume", {"volume": 40})]
    assert any(listed["id"] in (message or "") for message in heard)
    [record] = confirm_records(run)
    assert record["outcome"] == "allowed" and record["channel"] == "cli"
    assert record["decided_by"].startswith("cli")


@pytest.mark.parametrize("mode", ERAS)
async def test_calls_deny_refuses_the_waiting_call(tmp_path: Path, mode: str) -> None:
    """`calls deny`: isError naming the denial; the board never sees the call; a second
    decision on it is refused, and so is one for an id nobody gave out."""
    async with confirming(tmp_path) as (run, dev):
        env = cli_env(tmp_path / "cli")
        url = f"http://127.0.0.1:{run.host_port}"
        confirmations = run.gateway.router.confirmations
        async with Client(run.mcp_url, mode=mode) as client, anyio.create_task_group() as tg:
            results: list[types.CallToolResult] = []

            async def call() -> None:
                results.append(await client.call_tool(LAMP, {}))

            tg.start_soon(call)
            await until_waiting(confirmations)
            [waiting] = confirmations.waiting()
            code, out, err = await cli("calls", "deny", waiting.id, "--url", url, env=env)
            assert code == 0, err
        code, _, again = await cli("calls", "allow", waiting.id, "--url", url, env=env)
        assert code == 1 and f"call {waiting.id} is not waiting any more: denied" in again
        code, _, unknown = await cli("calls", "allow", "0123456789abcdef", "--url", url, env=env)
        assert code == 1 and "no call 0123456789abcdef waits" in unknown
    [result] = results
    assert result.is_error and "the owner denied it (cli" in result.content[0].text
    assert dev.calls == []
    [record] = confirm_records(run)
    assert record["outcome"] == "denied" and record["channel"] == "cli"


@pytest.mark.parametrize("mode", ERAS)
async def test_a_call_nobody_answers_is_refused_at_the_timeout(tmp_path: Path, mode: str) -> None:
    """`[calls] confirm_timeout` bounds the wait: then isError, and the board never saw it."""
    async with confirming(tmp_path, confirm_timeout=0.3) as (run, dev):
        async with Client(run.mcp_url, mode=mode) as client:
            with anyio.fail_after(bound(10)):
                result = await client.call_tool(LAMP, {})
        assert run.gateway.router.confirmations.waiting() == []
    assert result.is_error and "none came within 0.3 s" in result.content[0].text
    assert dev.calls == []
    [record] = confirm_records(run)
    assert record["outcome"] == "timeout" and record["decided_by"] == "gateway"


async def test_a_flood_of_confirm_calls_is_capped_per_caller(tmp_path: Path) -> None:
    """Past `[calls] confirm_max_pending` waiting calls of one caller, more are refused at once
    with the reason; the ones waiting stay listed."""
    async with confirming(tmp_path, confirm_max_pending=2) as (run, dev):
        confirmations = run.gateway.router.confirmations
        async with Client(run.mcp_url, mode="legacy") as client, anyio.create_task_group() as tg:
            for volume in (10, 20):
                tg.start_soon(client.call_tool, VOLUME, {"volume": volume})
            await until_waiting(confirmations, 2)
            refused = await client.call_tool(VOLUME, {"volume": 30})
            assert refused.is_error and "confirm_max_pending" in refused.content[0].text
            assert len(confirmations.waiting()) == 2
            tg.cancel_scope.cancel()
    assert dev.calls == []


async def test_a_2026_answer_counts_once_and_only_for_its_own_call(tmp_path: Path) -> None:
    """2026-07-28 era, the MRTR legs driven by hand: a yes answering the question of another
    call (other arguments) is refused; the same requestState replayed after its use is
    refused; a yes sent with no requestState asks anew. The board sees none of them."""
    accept = {"confirm": types.ElicitResult(action="accept", content={"confirm": True})}
    async with confirming(tmp_path) as (run, dev):
        async with Client(run.mcp_url, mode="2026-07-28", elicitation_callback=yes()) as client:
            session = client.session
            first = await session.call_tool(VOLUME, {"volume": 10}, allow_input_required=True)
            assert isinstance(first, types.InputRequiredResult) and first.request_state
            other = await session.call_tool(
                VOLUME, {"volume": 99}, input_responses=accept, request_state=first.request_state
            )
            assert other.is_error and "was for another call" in other.content[0].text
            replayed = await session.call_tool(
                VOLUME, {"volume": 10}, input_responses=accept, request_state=first.request_state
            )
            assert replayed.is_error and "is not open" in replayed.content[0].text
            forged = await session.call_tool(
                VOLUME, {"volume": 10}, input_responses=accept, allow_input_required=True
            )
            assert isinstance(forged, types.InputRequiredResult)  # asked, not taken as a yes
    assert dev.calls == []


async def test_a_confirm_glob_naming_no_tool_is_logged_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo in `confirm` leaves a tool unguarded: the start's log names the glob and the
    device (the gateway starts all the same)."""
    async with gateway(tmp_path / "gw") as run, listed_device(run, SIM_ID):
        pass  # the board's tools are known from now on
    typo = {SIM_ID: DeviceOptions(confirm=("self.lamp.turn_on", "self.dor.*"))}
    with caplog.at_level("WARNING", logger="gateway.devices.confirm_rules"):
        async with gateway(tmp_path / "gw", devices=typo):
            pass
    named = [r.getMessage() for r in caplog.records if "confirm" in r.getMessage()]
    assert len(named) == 1 and "'self.dor.*'" in named[0] and "sim-esp32_0001" in named[0]


async def test_the_typescript_sdk_s_elicitation_handler_confirms_a_call(tmp_path: Path) -> None:
    """A host on the TypeScript SDK (tests/e2e/ts_elicitation_client.mjs, @modelcontextprotocol/
    sdk as tests/programs.py pins it) that declared form elicitation is asked inside the call;
    its yes lets the board act."""
    modules = npm_package("@modelcontextprotocol/sdk").parent.parent
    script = TS_CLIENT.with_name("ts_elicitation_client.mjs")
    async with confirming(tmp_path) as (run, dev):
        with anyio.fail_after(bound(30)):
            done = await anyio.run_process(
                [node(), str(script), str(modules), run.mcp_url, VOLUME, '{"volume": 25}'],
                check=False,
            )
    assert done.returncode == 0, done.stderr.decode()
    said = json.loads(done.stdout.decode().strip().splitlines()[-1])
    [question] = said["asked"]
    assert "ts-elicitation-host" in question["message"] and "volume = 25" in question["message"]
    assert question["requestedSchema"]["required"] == ["confirm"]
    assert not said["result"].get("isError"), said["result"]
    assert dev.calls == [("self.audio_speaker.set_volume", {"volume": 25})]
    [record] = confirm_records(run)
    assert record["channel"] == "elicitation" and record["outcome"] == "allowed"
