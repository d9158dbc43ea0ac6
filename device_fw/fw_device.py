"""The device runtime: keep a link to the gateway up and serve MCP over it.

    device = Device(server, link)
    await device.run()  # forever: open the link, serve, back off, reconnect

A link is WsLink or MqttLink: open(), recv() -> dict or None, send(text), close(), abort(),
plus ``session_id`` and ``max_message``. An ``alert`` from the gateway (notify_device: all
three of status, message and emotion strings, as stock firmware requires) goes to
``on_alert(status, message, emotion)``; ``events`` (fw_events.Events) sends events. Every MCP
request is answered in its own task, so a slow tool holds back no other reply; replies may
leave out of order (the gateway matches ids).
"""

import asyncio

import fw_compat as compat
import fw_envelope as env
from fw_events import Events

TOOLS_CHANGED = "notifications/tools/list_changed"


def backoff(attempt, low=1.0, high=30.0):
    """Seconds before reconnect attempt ``attempt`` (0-based): the ceiling doubles from
    ``low`` to ``high``, jittered down to half of it so a fleet does not retry in step."""
    ceiling = min(high, low * 2**attempt)
    return compat.uniform(max(low, ceiling / 2), ceiling)


class Device:
    """Serves ``server`` over ``link``; ``tag`` prefixes log lines (the device id)."""

    def __init__(self, server, link, tag="device", backoff_low=1.0, backoff_high=30.0):
        self.server = server
        self.link = link
        self.tag = tag
        self.backoff_low = backoff_low
        self.backoff_high = backoff_high
        self.network = None  # optional coroutine function run before each connect (Wi-Fi)
        self.connected = False
        self.sessions = 0
        self.last_error = None  # why the last connection attempt failed (for the simulator)
        self._tasks = []
        server.listener = self.notify
        self.on_alert = None  # called with (status, message, emotion) for each alert
        self.events = Events(self.notify)

    async def run(self):
        """Stay connected until cancelled; a session that got up resets the backoff."""
        attempt = 0
        while True:
            try:
                if self.network:
                    await self.network()
                await self.link.open()
            except Exception as exc:
                self.last_error = exc
                compat.log(compat.WARNING, "%s: cannot connect: %r", self.tag, exc)
            else:
                attempt = 0
                await self.serve()
            delay = backoff(attempt, self.backoff_low, self.backoff_high)
            attempt += 1
            compat.log(compat.INFO, "%s: reconnecting in %.1f s", self.tag, delay)
            await asyncio.sleep(delay)

    async def serve(self):
        """Answer messages from the open link until it goes down."""
        self.connected = True
        self.sessions += 1
        compat.log(compat.INFO, "%s: connected, session %r", self.tag, self.link.session_id)
        try:
            while True:
                message = await self.link.recv()
                if message is None:
                    break
                self.dispatch(message)
        finally:
            self.connected = False
            self.link.abort()
            for task in self._tasks:
                task.cancel()
            self._tasks = []
            compat.log(compat.INFO, "%s: disconnected", self.tag)

    def dispatch(self, message):
        """Handle one message from the gateway (only ``mcp`` envelopes need an answer)."""
        payload = message.get("payload")
        kind = message.get("type")
        if kind == "mcp" and isinstance(payload, dict):
            self._spawn(self.answer(payload))
        elif kind == "alert" and self.on_alert:
            shown = [message.get(key) for key in ("status", "message", "emotion")]
            if all(isinstance(value, str) for value in shown):
                self.on_alert(*shown)

    async def answer(self, payload):
        """Answer one JSON-RPC payload."""
        try:
            reply = await self.server.handle(payload)
        except Exception as exc:
            compat.print_exception(exc)
            return
        if reply is not None:
            await self.send(reply)

    async def send(self, payload):
        """Send ``payload`` in an mcp envelope; a lost message is only logged."""
        text = env.mcp(self.link.session_id, payload)
        size = len(text.encode())
        if size > self.link.max_message:
            # Stock firmware loses its channel here (docs/protocol.md 7.3); we say why.
            message = "Reply too large: %d bytes, the limit is %d" % (size, self.link.max_message)
            compat.log(compat.ERROR, "%s: %s", self.tag, message)
            if "id" not in payload:
                return
            text = env.mcp(self.link.session_id, env.error(payload["id"], message, -32603))
        compat.log(compat.DEBUG, "%s > %s", self.tag, text)
        try:
            await self.link.send(text)
        except Exception as exc:
            compat.log(compat.INFO, "%s: message lost: %r", self.tag, exc)

    def notify(self, payload):
        """Send a notification from the server (tools changed) if connected."""
        if self.connected:
            self._spawn(self.send(payload))

    async def drain(self):
        """Wait until every message in flight is answered (and every notification sent)."""
        while self._tasks:
            await self._tasks.pop(0)

    def restart(self):
        """Drop the connection as a board losing power would; run() reconnects."""
        self.link.abort()

    def _spawn(self, coro):
        self._tasks = [task for task in self._tasks if not task.done()]
        self._tasks.append(asyncio.create_task(coro))
