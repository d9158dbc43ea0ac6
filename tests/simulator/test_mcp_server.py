"""DeviceMcpServer in memory: JSON-RPC in, the stock firmware's reply (or silence) out."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device_fw.fw_envelope import dumps
from gateway.simulator import (
    PAGE_LIMIT,
    Args,
    DeviceMcpServer,
    DeviceReboot,
    Prop,
    SimTool,
    ToolError,
    Vision,
    default_tools,
)
from gateway.simulator.simtool import JsonObject

pytestmark = pytest.mark.anyio

USER_ONLY = {"self.get_system_info", "self.reboot", "self.upgrade_firmware"}


async def rpc(server: DeviceMcpServer, method: str, params: Any = None, **extra: Any) -> Any:
    """Send one request (id 1 unless given) and return the whole reply."""
    payload: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": method, **extra}
    if params is not None:
        payload["params"] = params
    return await server.handle(payload)


async def result(server: DeviceMcpServer, method: str, params: Any = None) -> Any:
    reply = await rpc(server, method, params)
    assert reply is not None and "result" in reply, reply
    return reply["result"]


async def error(server: DeviceMcpServer, method: str, params: Any = None) -> str:
    reply = await rpc(server, method, params)
    assert reply is not None and set(reply) == {"jsonrpc", "id", "error"}, reply
    assert set(reply["error"]) == {"message"}, "stock errors carry no code"
    message: str = reply["error"]["message"]
    return message


async def list_all(server: DeviceMcpServer, with_user_tools: object) -> list[JsonObject]:
    """Follow nextCursor like a client; return every page's result."""
    pages: list[JsonObject] = []
    params: dict[str, Any] = {"withUserTools": with_user_tools}
    while True:
        page = await result(server, "tools/list", params)
        pages.append(page)
        if "nextCursor" not in page:
            return pages
        params = {"withUserTools": with_user_tools, "cursor": page["nextCursor"]}


def echo_tool(name: str = "self.echo", **props: Prop) -> SimTool:
    async def echo(args: Args) -> JsonObject:
        return dict(args)

    return SimTool(name, "Echo the arguments.", props, echo)


def sized_tool(name: str, size: int) -> SimTool:
    """A tool whose listed JSON is exactly ``size`` bytes."""
    bare = len(dumps(echo_tool(name).to_json()).encode()) - len("Echo the arguments.")
    return SimTool(name, "x" * (size - bare), {}, echo_tool().handler)


async def test_initialize_answers_like_stock_and_remembers_vision() -> None:
    """initialize gives the stock result; a camera board keeps capabilities.vision (url, token)."""
    server = DeviceMcpServer(
        [echo_tool("self.camera.take_photo")],
        board="sim-esp32",
        fw_version="2.4.2",
        list_changed=False,
    )
    vision = {"url": "http://gw/vision/explain", "token": "t"}
    reply = await rpc(server, "initialize", {"capabilities": {"vision": vision}})
    assert reply == {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {
            "protocolVersion": "2024-11-05",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "sim-esp32", "version": "2.4.2"},
        },
    }
    assert list(reply) == ["jsonrpc", "id", "result"]
    assert server.vision == Vision("http://gw/vision/explain", "t")
    announced = await result(DeviceMcpServer(), "initialize")
    assert announced["capabilities"] == {"tools": {"listChanged": True}}


async def test_initialize_ignores_a_vision_url_that_is_not_a_string() -> None:
    """A non-string vision url is ignored; a missing token becomes ""."""
    server = DeviceMcpServer([echo_tool("self.camera.take_photo")])
    await result(server, "initialize", {"capabilities": {"vision": {"url": 5}}})
    assert server.vision is None
    await result(server, "initialize", {"capabilities": {"vision": {"url": "http://v"}}})
    assert server.vision == Vision("http://v", "")


async def test_a_board_without_a_camera_ignores_vision() -> None:
    """Stock keeps the vision URL only on a board with a camera (self.camera.take_photo)."""
    server = DeviceMcpServer(default_tools())
    vision = {"url": "http://gw/vision/explain", "token": "t"}
    await result(server, "initialize", {"capabilities": {"vision": vision}})
    assert server.vision is None


async def test_default_catalogue_spans_three_pages_with_user_tools() -> None:
    """Stock paging: ≤ 8000 bytes a page, nextCursor = the first tool left out."""
    server = DeviceMcpServer(default_tools())
    pages = await list_all(server, with_user_tools=True)
    assert len(pages) == 3
    listed = [tool for page in pages for tool in page["tools"]]
    assert [t["name"] for t in listed] == [t.name for t in server.tools]
    for page, following in zip(pages, pages[1:], strict=False):
        assert page["nextCursor"] == following["tools"][0]["name"]
    for page in pages:
        assert len(dumps(page).encode()) + 30 <= PAGE_LIMIT


async def test_user_only_tools_are_listed_only_with_user_tools() -> None:
    """Without withUserTools (or with a non-bool one) user-only tools are skipped."""
    server = DeviceMcpServer(default_tools())
    for flag in (False, "true", 1):
        names = [t["name"] for p in await list_all(server, flag) for t in p["tools"]]
        assert not USER_ONLY & set(names)
        assert len(names) == len(server.tools) - len(USER_ONLY)
    listed = [t for p in await list_all(server, True) for t in p["tools"]]
    user = [t for t in listed if t["name"] in USER_ONLY]
    assert user and all(t["annotations"] == {"audience": ["user"]} for t in user)


async def test_listing_restarts_at_the_cursor() -> None:
    """The cursor names the first tool of the page (stock restarts *at* it)."""
    server = DeviceMcpServer(default_tools())
    third = server.tools[2].name
    page = await result(server, "tools/list", {"cursor": third})
    assert page["tools"][0]["name"] == third


async def test_a_tool_is_added_only_while_page_plus_30_fits_8000_bytes() -> None:
    """The boundary is exact: '{"tools":[' + tool + ',' + 30 bytes of slack ≤ 8000."""
    fits = PAGE_LIMIT - len('{"tools":[') - 1 - 30
    server = DeviceMcpServer([sized_tool("self.a", fits), sized_tool("self.b", 10)])
    first = await result(server, "tools/list")
    assert [t["name"] for t in first["tools"]] == ["self.a"]
    assert first["nextCursor"] == "self.b"
    too_big = DeviceMcpServer([sized_tool("self.a", fits + 1)])
    assert await error(too_big, "tools/list") == (
        "Failed to add tool self.a because of payload size limit"
    )


@given(st.lists(st.integers(min_value=120, max_value=7959), min_size=1, max_size=25))
def test_pages_are_full_lossless_and_in_order(sizes: list[int]) -> None:
    """Following nextCursor yields every tool once, in order, each page as full as stock's."""
    server = DeviceMcpServer([sized_tool(f"self.t{i}", n) for i, n in enumerate(sizes)])
    listed: list[int] = []
    cursor = ""
    while True:
        page = server.page(cursor)
        used = len('{"tools":[') + sum(len(dumps(t).encode()) + 1 for t in page["tools"])
        assert used + 30 <= PAGE_LIMIT
        listed += [int(t["name"].removeprefix("self.t")) for t in page["tools"]]
        if "nextCursor" not in page:
            break
        cursor = page["nextCursor"]
        assert used + sizes[int(cursor.removeprefix("self.t"))] + 1 + 30 > PAGE_LIMIT
    assert listed == list(range(len(sizes)))


async def test_unknown_cursor_is_an_error_naming_it() -> None:
    """An unknown cursor is an error that says so (stock's names no tool at all)."""
    server = DeviceMcpServer(default_tools())
    message = await error(server, "tools/list", {"cursor": "self.nope"})
    assert message == "Unknown cursor: self.nope"


async def test_a_non_string_cursor_is_ignored() -> None:
    """cursor must be a string to count; otherwise listing starts at the beginning."""
    server = DeviceMcpServer(default_tools())
    page = await result(server, "tools/list", {"cursor": 3})
    assert page["tools"][0]["name"] == "self.get_device_status"


async def test_empty_and_user_only_catalogues() -> None:
    """No tools, or only hidden user tools, lists [] (stock errors on the second)."""
    assert await result(DeviceMcpServer(), "tools/list") == {"tools": []}
    hidden = SimTool("self.reboot", "Reboot", {}, echo_tool().handler, user_only=True)
    assert await result(DeviceMcpServer([hidden]), "tools/list") == {"tools": []}


@pytest.mark.parametrize(
    "payload",
    [
        {"id": 1, "method": "tools/list"},
        {"jsonrpc": "1.0", "id": 1, "method": "tools/list"},
        {"jsonrpc": 2.0, "id": 1, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 1, "result": {}},
        {"jsonrpc": "2.0", "id": 1, "method": 7},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "notificationsX"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": []},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": None},
        {"jsonrpc": "2.0", "method": "tools/list"},
        {"jsonrpc": "2.0", "id": None, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": True, "method": "tools/list"},
    ],
)
async def test_messages_stock_firmware_drops(payload: dict[str, Any]) -> None:
    """Bad version, no string method, notifications, bad params, bad or no id: no reply."""
    assert await DeviceMcpServer(default_tools()).handle(payload) is None


async def test_ids_are_echoed_and_fractions_truncated() -> None:
    """Integer and string ids come back as sent; a fractional id is truncated (stock)."""
    server = DeviceMcpServer()
    assert (await rpc(server, "initialize", id=3.9))["id"] == 3
    assert (await rpc(server, "initialize", id=2**40))["id"] == 2**40
    assert (await rpc(server, "initialize", id="a-1"))["id"] == "a-1"


async def test_unknown_methods_and_ping() -> None:
    """Anything else is "Method not implemented"; ping=True answers {} like our firmware."""
    stock = DeviceMcpServer()
    assert await error(stock, "ping") == "Method not implemented: ping"
    assert await error(stock, "resources/list") == "Method not implemented: resources/list"
    assert await result(DeviceMcpServer(ping=True), "ping") == {}


async def test_error_codes_option_adds_json_rpc_codes() -> None:
    """error_codes=True is our firmware's behaviour: errors carry a JSON-RPC code."""
    server = DeviceMcpServer(default_tools(), error_codes=True)
    reply = await rpc(server, "nope")
    assert reply["error"] == {"code": -32601, "message": "Method not implemented: nope"}
    reply = await rpc(server, "tools/call", {"name": "self.nope"})
    assert reply["error"]["code"] == -32602


@pytest.mark.parametrize(
    ("params", "message"),
    [
        (None, "Missing params"),
        ({}, "Missing name"),
        ({"name": 5}, "Missing name"),
        ({"name": "self.echo", "arguments": []}, "Invalid arguments"),
        ({"name": "self.echo", "arguments": None}, "Invalid arguments"),
        ({"name": "self.nope"}, "Unknown tool: self.nope"),
    ],
)
async def test_tools_call_envelope_errors(params: Any, message: str) -> None:
    """tools/call checks params, name, arguments and the tool, in stock order."""
    assert await error(DeviceMcpServer([echo_tool()]), "tools/call", params) == message


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "Missing valid argument: volume"),
        ({"volume": "50"}, "Missing valid argument: volume"),
        ({"volume": True}, "Missing valid argument: volume"),
        ({"volume": -1}, "Value is below minimum allowed: 0"),
        ({"volume": 101}, "Value exceeds maximum allowed: 100"),
    ],
)
async def test_argument_errors(arguments: JsonObject, message: str) -> None:
    """A wrong JSON type counts as absent; out-of-range values get the stock messages."""
    server = DeviceMcpServer(default_tools())
    params = {"name": "self.audio_speaker.set_volume", "arguments": arguments}
    assert await error(server, "tools/call", params) == message


async def test_arguments_are_truncated_defaulted_and_filtered() -> None:
    """Numbers truncate to int, wrong types fall back to defaults, extra keys are ignored."""
    server = DeviceMcpServer(
        [echo_tool(n=Prop("integer"), flag=Prop("boolean", default=True), s=Prop("string", "d"))]
    )
    params = {"name": "self.echo", "arguments": {"n": 7.9, "flag": "no", "s": 1, "extra": 1}}
    text = (await result(server, "tools/call", params))["content"][0]["text"]
    assert text == '{"n":7,"flag":true,"s":"d"}'


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (False, "false"),
        (42, "42"),
        ("héllo", "héllo"),
        ({"a": [1, "é"]}, '{"a":[1,"é"]}'),
    ],
)
async def test_results_are_text_content(value: Any, text: str) -> None:
    """bool -> true/false, int -> decimal, str verbatim, JSON -> compact text; never isError."""

    async def handler(args: Args) -> Any:
        return value

    server = DeviceMcpServer([SimTool("self.t", "t", {}, handler)])
    assert await result(server, "tools/call", {"name": "self.t"}) == {
        "content": [{"type": "text", "text": text}],
        "isError": False,
    }


async def test_tool_failures_become_errors_and_reboot_passes_through() -> None:
    """ToolError -> its message; other exceptions -> their text; DeviceReboot propagates."""

    async def refuse(args: Args) -> bool:
        raise ToolError("Failed to capture photo")

    async def crash(args: Args) -> bool:
        raise RuntimeError("boom")

    async def reboot(args: Args) -> bool:
        raise DeviceReboot

    server = DeviceMcpServer(
        [SimTool("self.a", "", {}, refuse), SimTool("self.b", "", {}, crash),
         SimTool("self.c", "", {}, reboot, user_only=True)]
    )  # fmt: skip
    assert await error(server, "tools/call", {"name": "self.a"}) == "Failed to capture photo"
    assert await error(server, "tools/call", {"name": "self.b"}) == "boom"
    with pytest.raises(DeviceReboot):
        await rpc(server, "tools/call", {"name": "self.c"})


async def test_user_only_tools_are_callable_without_listing() -> None:
    """Like stock, tools/call does not check user_only."""
    server = DeviceMcpServer(default_tools())
    info = await result(server, "tools/call", {"name": "self.get_system_info"})
    assert '"chip_model_name":"esp32s3"' in info["content"][0]["text"]


async def test_add_and_remove_tools() -> None:
    """Tools are appended in order; duplicates and unknown names are refused."""
    server = DeviceMcpServer([echo_tool("self.a")])
    server.add_tool(echo_tool("self.b"))
    assert [t.name for t in server.tools] == ["self.a", "self.b"]
    with pytest.raises(ValueError, match="already registered"):
        server.add_tool(echo_tool("self.a"))
    server.remove_tool("self.a")
    assert [t["name"] for t in (await result(server, "tools/list"))["tools"]] == ["self.b"]
    with pytest.raises(KeyError):
        server.remove_tool("self.a")
