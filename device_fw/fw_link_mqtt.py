"""The MQTT link to the gateway.

Topics (DESIGN.md "Stock xiaozhi devices"): the device publishes every message to
``<prefix>/<device-id>/up`` (QoS 0, like stock) and subscribes itself to
``<prefix>/<device-id>/down`` (QoS 0: it survives a NATS failover, ``open``). It publishes a
retained ``online`` to ``<prefix>/<device-id>/status`` once connected, and leaves a retained
last will ``offline`` on the same topic, so the gateway sees it vanish. Client id and username
are the device id, the password is the device token. No hello over MQTT: the gateway starts
discovery when it sees the device online. Messages are the same JSON envelopes as over
WebSocket.
"""

import asyncio

import fw_compat as compat
import fw_envelope as env
from fw_mqtt import MqttClient


class MqttLink:
    """A reusable link with the same interface as WsLink."""

    max_message = 65535  # keep replies within what a WebSocket device could send too

    def __init__(self, host, port, device_id, token, prefix="xiaozhi", keepalive=60, tls=False):
        self.host = host
        self.port = port
        self.device_id = device_id.lower()
        self.token = token
        self.keepalive = keepalive
        self.tls = tls
        base = "%s/%s/" % (prefix, self.device_id)
        self.up, self.down, self.status = base + "up", base + "down", base + "status"
        self.session_id = ""
        self.client = None
        self._pinger = None

    async def open(self):
        """Connect, subscribe to our down topic and say we are online."""
        will = (self.status, b"offline", True, 1)
        client = MqttClient(self.device_id, self.host, self.port, self.device_id, self.token,
                            self.keepalive, will, self.tls)  # fmt: skip
        await client.connect()
        self.client = client
        try:
            # QoS 0: the session is clean, so what is in flight is lost with the connection at
            # any QoS, while on NATS a QoS 1 subscription is a JetStream consumer that the node
            # refuses (SUBACK 0x80) while it elects after another node died; at QoS 0 it is
            # granted at once. Measured on 3 NATS nodes, one SIGKILLed, a device reconnecting to
            # another (tests/nats_cluster.py), 7 and 6 runs: QoS 0 never refused, granted as soon
            # as the node took the connection (0.0 s, or 10.2-10.3 s when it held the connect
            # while electing); QoS 1 refused 2 and 3 times in a row in 2 runs (a reconnect
            # each), granted 0.5-12.6 s after the kill, later than QoS 0 in every run.
            await client.subscribe(self.down, 0)
            await client.publish(self.status, b"online", True, 1)
        except BaseException:
            client.abort()
            raise
        self._pinger = asyncio.create_task(self._keepalive(client))

    async def recv(self):
        """The next message for the device as a dict, or None once the link is down."""
        while True:
            # A PINGRESP arrives every keepalive/2 s, so silence for a keepalive means dead.
            item = await self.client.read(self.keepalive)
            if item is None:
                return None
            message = env.decode(item[1])
            if message is None:
                compat.log(compat.WARNING, "dropping an MQTT message that is not a JSON object")
            elif message.get("type") == "hello":
                session_id = message.get("session_id")
                if isinstance(session_id, str):
                    self.session_id = session_id
            else:
                return message

    async def send(self, text):
        """Publish one message to the up topic; OSError if the link is down."""
        if self.client is None:
            raise OSError("link not open")
        await self.client.publish(self.up, text)

    async def _keepalive(self, client):
        try:
            while client.writer is not None:
                await asyncio.sleep(self.keepalive / 2)
                await client.ping()
        except OSError:
            client.abort()

    def _stop_pinger(self):
        if self._pinger is not None:
            self._pinger.cancel()
            self._pinger = None

    async def close(self):
        """Say offline (a clean DISCONNECT suppresses the will) and disconnect."""
        self._stop_pinger()
        if self.client is not None:
            try:
                await self.client.publish(self.status, b"offline", True, 1)
            except OSError:
                pass
            await self.client.disconnect()

    def abort(self):
        """Drop the connection; the broker publishes our will."""
        self._stop_pinger()
        if self.client is not None:
            self.client.abort()
