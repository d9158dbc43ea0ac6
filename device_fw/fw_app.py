"""Boot: config, board, network, MCP server with its tools, link, then serve forever.

main.py runs ``asyncio.run(fw_app.start())``. Extra tools come from the modules named in the
config's "tools" list: each has a function ``tools(board)`` returning a list of fw_mcp.Tool
(see tool_dice.py and the README).
"""

import asyncio
import sys

import fw_compat as compat
import fw_config
from fw_board import make_board
from fw_device import Device
from fw_mcp import McpServer
from fw_tools import default_tools


def load_tools(server, board, module_name):
    """Register the tools of the module ``module_name``; return their names."""
    module = __import__(module_name)
    names = []
    for tool in module.tools(board):
        server.add(tool)
        names.append(tool.name)
    return names


def make_link(config, device_id, client_id):
    """The link the config asks for (imported on demand: a board loads only the one it uses)."""
    if config["transport"] == "mqtt":
        from fw_link_mqtt import MqttLink

        mqtt = config["mqtt"]
        return MqttLink(mqtt["host"], mqtt["port"], device_id, config["token"], mqtt["prefix"],
                        mqtt["keepalive"], mqtt["tls"])  # fmt: skip
    from fw_link_ws import WsLink

    return WsLink(config["url"], config["token"], device_id, client_id, config["ping_interval"])


def build(config):
    """(board, server, device) ready to run, from the settings."""
    compat.set_level(config["log"])
    board = make_board(config)
    server = McpServer(config["name"] or board.name, fw_config.VERSION)
    device_id = (config["device_id"] or board.mac() or "").lower()
    client_id = fw_config.client_id(config)
    tools = default_tools(board)
    if board.camera:  # loaded only by boards that have one
        from fw_camera import camera_tool

        tools.insert(1, camera_tool(board, server, device_id, client_id))  # next to status
    for tool in tools:
        server.add(tool)
    for module_name in config["tools"]:
        load_tools(server, board, module_name)
    low, high = config["backoff"]
    device = Device(server, make_link(config, device_id, client_id), device_id, low, high)
    device.network = board.start_network
    device.on_alert = board.alert
    board.on_reboot = device.restart
    board.events = device.events  # for the board's own buttons and sensors
    return board, server, device


async def console(server, board, device):
    """Commands on standard input (the serial console, or a test's pipe):
    ``add <module>``, ``remove <tool>``, ``drop`` (lose the link), ``mem`` (heap after a
    collection), ``press <button>`` (an event, as a button would), ``event <logger> <JSON>``
    (any event), ``screen`` (the last alert shown). Each is answered with an ``ok ...`` or
    ``error ...`` line.
    """
    stdin = asyncio.StreamReader(sys.stdin)
    while True:
        line = await stdin.readline()
        if not line:
            return
        verb, _, arg = line.decode().strip().partition(" ")
        try:
            if verb == "add":
                result = load_tools(server, board, arg)
            elif verb == "remove":
                result = server.remove(arg)
            elif verb == "drop":
                result = device.restart()
            elif verb == "press":
                result = device.events.press(arg)
            elif verb == "event":
                logger, _, data = arg.partition(" ")
                result = device.events.emit(logger, __import__("json").loads(data or "null"))
            elif verb == "screen":
                result = repr(board.shown)
            elif verb == "mem":
                __import__("gc").collect()
                result = "free=%s used=%s" % compat.memory()
            else:
                raise ValueError("unknown command " + verb)
            print("ok", verb, arg, result or "")
        except Exception as exc:
            print("error", verb, arg, repr(exc))


async def start(path=None):
    """Run the device from its config file; never returns."""
    config = fw_config.load(path)
    board, server, device = build(config)
    compat.log(compat.INFO, "%s %s: %d tools, device id %s", server.name, fw_config.VERSION,
               len(server.tools), device.tag)  # fmt: skip
    if config["console"]:
        asyncio.create_task(console(server, board, device))
    await device.run()
