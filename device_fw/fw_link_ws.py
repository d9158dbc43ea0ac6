"""The WebSocket link to the gateway, opened the way stock firmware opens it.

Same upgrade headers (Authorization: Bearer <token>, Protocol-Version: 1, Device-Id,
Client-Id) and the same hello as stock xiaozhi firmware; then it waits up to 10 s for the
server hello, which must say transport "websocket" and gives the session id
(docs/protocol.md 1). While open, it pings the gateway every ``ping_interval`` seconds and
calls the connection dead when nothing at all arrives for twice that long (the gateway also
pings every 20 s, so a live gateway is never silent that long).
"""

import asyncio

import fw_compat as compat
import fw_envelope as env
import fw_ws

HELLO_TIMEOUT = 10  # seconds a stock device waits for the server hello
MAX_FRAME = 65535  # esp-ml307 cannot send a bigger frame (docs/protocol.md 7.3)


class HelloError(Exception):
    """No acceptable server hello: none within 10 s, or the connection closed first."""


class WsLink:
    """A reusable link: open(), then recv()/send() until recv() returns None, then close()."""

    max_message = MAX_FRAME

    def __init__(self, url, token, device_id, client_id, ping_interval=30, hello=None):
        self.url = url
        self.token = token
        self.device_id = device_id.lower()
        self.client_id = client_id
        self.ping_interval = ping_interval
        self.hello = hello or env.HELLO
        self.session_id = ""
        self.ws = None
        self._early = []
        self._pinger = None

    def headers(self):
        """The upgrade request's own headers, in stock order (a std::map's: alphabetical)."""
        headers = []
        if self.token:
            # Stock sends a token that already holds a space verbatim (e.g. "Basic ...").
            token = self.token
            headers.append(("Authorization", token if " " in token else "Bearer " + token))
        headers.append(("Client-Id", self.client_id))
        headers.append(("Device-Id", self.device_id))
        headers.append(("Protocol-Version", "1"))
        return headers

    async def open(self):
        """Connect, say hello and wait for the server's; raise if any step fails."""
        self.ws = ws = await fw_ws.connect(self.url, self.headers(), HELLO_TIMEOUT)
        self._early = []
        try:
            await ws.send(env.dumps(self.hello))
            await compat.wait_for(self._server_hello(), HELLO_TIMEOUT)
        except asyncio.TimeoutError:
            ws.abort()
            raise HelloError("no server hello within %d s" % HELLO_TIMEOUT)
        except BaseException:
            ws.abort()
            raise
        if self.ping_interval:  # None: never ping, wait forever (as stock devices do)
            ws.timeout = self.ping_interval * 2
            self._pinger = asyncio.create_task(self._keepalive(ws))

    async def _server_hello(self):
        while True:
            message = await self._next()
            if message is None:
                raise HelloError("connection closed before the server hello")
            if message.get("type") != "hello":
                self._early.append(message)  # stock serves MCP even before the hello
            elif self._on_hello(message):
                return

    def _on_hello(self, hello):
        session_id = env.server_session(hello, self.session_id)
        if session_id is None:
            compat.log(compat.WARNING, "ignoring a server hello for %r", hello.get("transport"))
            return False
        self.session_id = session_id
        return True

    async def recv(self):
        """The next message for the device as a dict, or None once the link is down."""
        if self._early:
            return self._early.pop(0)
        while True:
            message = await self._next()
            if message is None or message.get("type") != "hello":
                return message
            self._on_hello(message)  # stock parses every server hello, not just the first

    async def _next(self):
        while True:
            data = await self.ws.recv()
            if data is None:
                return None
            if isinstance(data, str):  # binary frames carry audio, nothing for us
                message = env.decode(data)
                if message is not None:
                    return message
                compat.log(compat.WARNING, "dropping a frame that is not a JSON object")

    async def send(self, text):
        """Send one message; OSError if the link is down."""
        if self.ws is None:
            raise OSError("link not open")
        await self.ws.send(text)

    async def _keepalive(self, ws):
        try:
            while not ws.closed:
                await asyncio.sleep(self.ping_interval)
                await ws.ping()
        except OSError:
            ws.abort()

    def _stop_pinger(self):
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None

    async def close(self):
        """Close with a close frame."""
        self._stop_pinger()
        if self.ws is not None:
            await self.ws.close()

    def abort(self):
        """Drop the connection without a close frame."""
        self._stop_pinger()
        if self.ws is not None:
            self.ws.abort()
