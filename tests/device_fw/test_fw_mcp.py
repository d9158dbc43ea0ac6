"""fw_mcp with our firmware's defaults: JSON-RPC codes, ping, listChanged, hints, numbers.

(The stock semantics it shares are also covered through the simulator's facade in
tests/simulator/test_mcp_server.py, and against the recorded vectors in test_vectors.py.)
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from device_fw.fw_envelope import INTERNAL_ERROR, INVALID_PARAMS, dumps
from device_fw.fw_mcp import McpServer, Prop, Tool, ToolError
from device_fw.fw_tool import text_of
from tests.device_fw.conftest import TESTS, passed_checks, run_on_micropython

sys.path.append(str(TESTS))  # cancel_scenario imports the firmware by its board names
import cancel_scenario  # noqa: E402

Check = Callable[[], Coroutine[Any, Any, None]]
CHECKS: list[tuple[str, Check]] = cancel_scenario.CHECKS


def handle(server: McpServer, method: str, params: Any = None, request_id: Any = 1) -> Any:
    payload: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        payload["params"] = params
    return asyncio.run(server.handle(payload))


def server_with(*tools: Tool) -> McpServer:
    server = McpServer("board", "1.0")
    for tool in tools:
        server.add(tool)
    return server


def test_errors_carry_json_rpc_codes_by_default() -> None:
    """Unknown method -32601, bad arguments -32602, a crashing tool -32603, ToolError -32000."""

    def crash(args: dict[str, Any]) -> bool:
        raise RuntimeError("boom")

    def refuse(args: dict[str, Any]) -> bool:
        raise ToolError("busy")

    server = server_with(
        Tool("self.crash", "", (), crash),
        Tool("self.refuse", "", (), refuse),
        Tool("self.n", "", [Prop("n", "integer", minimum=0)], lambda args: True),
    )
    assert handle(server, "nope")["error"]["code"] == -32601
    bad = handle(server, "tools/call", {"name": "self.n", "arguments": {"n": -1}})
    assert bad["error"] == {"code": INVALID_PARAMS, "message": "Value is below minimum allowed: 0"}
    crashed = handle(server, "tools/call", {"name": "self.crash"})
    assert crashed["error"] == {"code": INTERNAL_ERROR, "message": "boom"}
    assert handle(server, "tools/call", {"name": "self.refuse"})["error"]["code"] == -32000


def test_ping_and_initialize_announce_our_extensions() -> None:
    """ping answers {}; initialize says tools.listChanged."""
    server = server_with()
    assert handle(server, "ping")["result"] == {}
    result = handle(server, "initialize", {})["result"]
    assert result["capabilities"] == {"tools": {"listChanged": True}}
    assert result["serverInfo"] == {"name": "board", "version": "1.0"}


def test_adding_or_removing_a_tool_notifies_the_listener() -> None:
    """Each change calls the listener with notifications/tools/list_changed; stock mode not."""
    sent: list[dict[str, Any]] = []
    server = server_with()
    server.listener = sent.append
    server.add(Tool("self.a", "", (), lambda args: True))
    server.remove("self.a")
    assert sent == [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}] * 2
    stock = McpServer("b", "1", list_changed=False)
    stock.listener = sent.append
    stock.add(Tool("self.a", "", (), lambda args: True))
    assert len(sent) == 2


def test_handlers_may_be_plain_or_async() -> None:
    """A sync handler's value and an async handler's awaited value both become the text."""

    async def later(args: dict[str, Any]) -> str:
        await asyncio.sleep(0)
        return "later"

    server = server_with(
        Tool("self.now", "", (), lambda args: 7), Tool("self.later", "", (), later)
    )
    assert handle(server, "tools/call", {"name": "self.now"})["result"]["content"][0]["text"] == "7"
    reply = handle(server, "tools/call", {"name": "self.later"})
    assert reply["result"]["content"][0]["text"] == "later"


def test_hints_descriptions_and_numbers_in_the_listing() -> None:
    """hints become annotations next to audience; descriptions and number ranges are listed."""
    tool = Tool(
        "self.t",
        "T",
        [Prop("x", "number", 0.5, 0, 1.5, "a ratio")],
        lambda args: args["x"],
        user=True,
        hints={"readOnlyHint": True},
    )
    listed = tool.to_json()
    assert listed["annotations"] == {"readOnlyHint": True, "audience": ["user"]}
    assert listed["inputSchema"] == {
        "type": "object",
        "properties": {
            "x": {
                "type": "number",
                "description": "a ratio",
                "default": 0.5,
                "minimum": 0,
                "maximum": 1.5,
            }  # fmt: skip
        },
    }
    server = server_with(tool)
    reply = handle(server, "tools/call", {"name": "self.t", "arguments": {"x": 1.25}})
    assert reply["result"]["content"][0]["text"] == "1.25"


def test_string_ids_are_answered_with_the_same_id() -> None:
    """JSON-RPC allows string ids; the firmware echoes them (stock drops them)."""
    assert handle(server_with(), "ping", request_id="req-7")["id"] == "req-7"


@pytest.mark.parametrize(
    ("value", "text"),
    [(True, "true"), (False, "false"), (3, "3"), (2.5, "2.5"), ("é", "é"), (None, "null"),
     ([1, {"a": "é"}], '[1,{"a":"é"}]')],
)  # fmt: skip
def test_results_render_like_stock(value: Any, text: str) -> None:
    """bool/int/str like stock McpTool::Call, anything else as compact UTF-8 JSON."""
    assert text_of(value) == text


def test_dumps_keeps_utf8_so_pages_split_alike_on_both_runtimes() -> None:
    """CPython is told not to escape non-ASCII, as MicroPython never does."""
    assert dumps({"d": "台灯"}) == '{"d":"台灯"}'


def test_duplicate_and_unknown_tools_are_refused() -> None:
    """add() refuses a taken name, remove() an unknown one."""
    server = server_with(Tool("self.a", "", (), lambda args: True))
    with pytest.raises(ValueError, match="already registered"):
        server.add(Tool("self.a", "", (), lambda args: True))
    with pytest.raises(KeyError):
        server.remove("self.b")


# notifications/cancelled (tests/device_fw/cancel_scenario.py plays the gateway).


@pytest.mark.parametrize(("name", "check"), CHECKS, ids=[name for name, _ in CHECKS])
def test_cancellation_on_cpython(name: str, check: Check) -> None:
    """A cancelled async handler stops and its call gets no reply; other calls are answered."""
    asyncio.run(check())


def test_cancellation_on_micropython() -> None:
    """The same checks pass on the real MicroPython unix port."""
    output = run_on_micropython("cancel_scenario.py")
    passed = passed_checks(output)
    assert passed == [name for name, _ in CHECKS], output


def test_a_sync_handler_cannot_be_cancelled_and_is_answered() -> None:
    """A plain handler has finished before any notification can arrive: it is answered."""
    server = server_with(Tool("self.now", "", (), lambda args: True))
    reply = handle(server, "tools/call", {"name": "self.now"}, request_id=4)
    assert reply["result"]["content"][0]["text"] == "true"
    assert server.cancel(4) is False and server.running == {}
