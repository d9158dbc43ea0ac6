"""A tiny MCP server with the stock xiaozhi firmware's semantics (docs/protocol.md 4).

    server = McpServer("my-board", "0.1.0")
    server.add(Tool("self.speaker.set_volume", "Set the volume.",
                    [Prop("volume", "integer", minimum=0, maximum=100)], set_volume))
    reply = await server.handle(payload)  # None: send nothing

A handler takes the dict of validated arguments, returns bool, int, str or any JSON value
(sent as text), may be async, and raises ToolError for a failure the caller should read.
An async handler runs in a task that notifications/cancelled cancels; then nothing is sent
(stock ignores the notification). Needs only fw_envelope.py and fw_tool.py.
"""

import asyncio

import fw_envelope as env
from fw_envelope import ToolError
from fw_tool import Prop, Tool

__all__ = ["McpServer", "Prop", "Tool", "ToolError"]

PAGE_LIMIT = 8000  # bytes of one tools/list result, as stock firmware pages it
_PAGE_SLACK = 30
_PAGE_HEAD = 10  # len('{"tools":[')
CANCELLED = "notifications/cancelled"
CAMERA = "self.camera.take_photo"
_GONE = object()  # a cancelled call's result: no reply


class McpServer:
    """codes: JSON-RPC error codes; ping: answer ping; list_changed: pass
    notifications/tools/list_changed to ``listener`` when tools change (stock does none)."""

    def __init__(self, name, version, codes=True, ping=True, list_changed=True):
        self.name = name
        self.version = version
        self.codes = codes
        self.ping = ping
        self.list_changed = list_changed
        self.page_limit = PAGE_LIMIT
        self.tools = []
        self.vision = None  # (url, token) from initialize's capabilities.vision
        self.listener = None
        self.running = {}  # request id -> the task of its async handler

    def find(self, name):
        """The tool called ``name``, or None."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None

    def add(self, tool):
        """Register ``tool`` after the others (ValueError if the name is taken)."""
        if self.find(tool.name):
            raise ValueError("tool %s is already registered" % tool.name)
        self.tools.append(tool)
        self._changed()
        return tool

    def remove(self, name):
        """Unregister the tool ``name`` (KeyError if there is none)."""
        tool = self.find(name)
        if tool is None:
            raise KeyError(name)
        self.tools.remove(tool)
        self._changed()

    def _changed(self):
        if self.list_changed and self.listener:
            self.listener(env.notification("notifications/tools/list_changed"))

    async def handle(self, msg):
        """Answer one JSON-RPC message: the reply, or None when nothing must be sent."""
        # docs/protocol.md 4: checked in this order; each failure drops the message.
        if msg.get("jsonrpc") != "2.0":
            return None
        method = msg.get("method")
        params = msg.get("params")
        if method == CANCELLED and isinstance(params, dict):
            self.cancel(params.get("requestId"))
            return None
        if not isinstance(method, str) or method.startswith("notifications"):
            return None
        if "params" in msg and not isinstance(params, dict):
            return None
        rid = msg.get("id")
        if isinstance(rid, bool) or not isinstance(rid, (int, float, str)):
            return None
        if isinstance(rid, float):
            rid = int(rid)
        try:
            result = await self._dispatch(method, params, rid)
        except ToolError as exc:
            return env.error(rid, exc.message, exc.code if self.codes else None)
        return None if result is _GONE else env.result(rid, result)

    def cancel(self, rid):
        """Cancel the async handler of request ``rid``; False if none runs."""
        task = self.running.pop(rid, None)
        if task:
            task.cancel()
        return task is not None

    async def _dispatch(self, method, params, rid):
        if method == "tools/call":
            return await self._call(params, rid)
        params = params or {}
        if method == "initialize":
            return self._initialize(params)
        if method == "tools/list":
            cursor = params.get("cursor")
            with_user = params.get("withUserTools") is True
            return self.page(cursor if isinstance(cursor, str) else "", with_user)
        if method == "ping" and self.ping:
            return {}
        raise ToolError("Method not implemented: " + method, env.METHOD_NOT_FOUND)

    def _initialize(self, params):
        caps = params.get("capabilities")
        vision = caps.get("vision") if isinstance(caps, dict) else None
        url = vision.get("url") if isinstance(vision, dict) else None
        if isinstance(url, str) and self.find(CAMERA):  # stock: kept by camera boards only
            token = vision.get("token")
            self.vision = (url, token if isinstance(token, str) else "")
        return {
            "protocolVersion": "2024-11-05",
            "capabilities": {"tools": {"listChanged": True} if self.list_changed else {}},
            "serverInfo": {"name": self.name, "version": self.version},
        }

    def page(self, cursor="", with_user=False):
        """One tools/list result, paged like stock firmware (docs/protocol.md 4)."""
        # Restart at the tool named cursor; stop before the tool that would take the page over
        # page_limit bytes, whose name becomes nextCursor.
        tools = []
        size = _PAGE_HEAD
        following = None
        found = not cursor
        for tool in self.tools:
            found = found or tool.name == cursor
            if not found or (tool.user and not with_user):
                continue
            entry = tool.to_json()
            entry_size = len(env.dumps(entry).encode()) + 1
            if size + entry_size + _PAGE_SLACK > self.page_limit:
                following = tool.name
                break
            tools.append(entry)
            size += entry_size
        if not found:
            raise ToolError("Unknown cursor: " + cursor, env.INVALID_PARAMS)
        if following and not tools:
            message = "Failed to add tool %s because of payload size limit" % following
            raise ToolError(message, env.INTERNAL_ERROR)
        listing = {"tools": tools}
        if following:
            listing["nextCursor"] = following
        return listing

    async def _call(self, params, rid):
        if params is None:
            raise ToolError("Missing params", env.INVALID_PARAMS)
        name = params.get("name")
        if not isinstance(name, str):
            raise ToolError("Missing name", env.INVALID_PARAMS)
        arguments = params.get("arguments", {})
        if not isinstance(arguments, dict):
            raise ToolError("Invalid arguments", env.INVALID_PARAMS)
        tool = self.find(name)  # stock: user-only tools are callable, only unlisted
        if tool is None:
            raise ToolError("Unknown tool: " + name, env.INVALID_PARAMS)
        args = tool.parse(arguments)
        try:
            value = tool.handler(args)
            if hasattr(value, "send"):  # a coroutine (CPython) or generator (MicroPython)
                value = await self._run(rid, value)
        except ToolError:
            raise
        except Exception as exc:
            raise ToolError(str(exc) or type(exc).__name__, env.INTERNAL_ERROR)
        return value if value is _GONE else tool.result(value)

    async def _run(self, rid, coro):
        # Its own task: cancel() stops this handler alone.
        task = self.running[rid] = asyncio.create_task(coro)
        try:
            return await task
        except asyncio.CancelledError:
            if self.running.get(rid) is not task:
                return _GONE  # cancel() took it
            task.cancel()  # we were cancelled (link lost): the handler stops too
            raise
        finally:
            if self.running.get(rid) is task:
                del self.running[rid]
