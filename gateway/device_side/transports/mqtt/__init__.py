"""The MQTT transport: each device present on the broker becomes a ``DeviceLink``.

One client (aiomqtt, on the event loop) subscribes to ``<prefix>/+/up`` and
``<prefix>/+/status`` and publishes to ``<prefix>/<device-id>/down`` (``broker.topics``).
``links()`` yields a new link each time a device appears; the gateway runs a ``DeviceConnection``
over it, exactly as for a WebSocket.

The rooms: ``client`` (the broker login and the one client: connect, subscribe, reconnect with
backoff, publish), ``link`` (``MqttLink``, one device's session over its topics), ``liveness``
(what is known of each device, probes of silent devices, keepalive pings) and ``transport``
(``MqttTransport``: routes each message by topic and decides when a device has a link).
"""

from gateway.device_side.transports.mqtt.client import BrokerLogin, honour_cancellation
from gateway.device_side.transports.mqtt.link import MqttLink
from gateway.device_side.transports.mqtt.transport import MqttTransport

__all__ = ["BrokerLogin", "MqttLink", "MqttTransport", "honour_cancellation"]
