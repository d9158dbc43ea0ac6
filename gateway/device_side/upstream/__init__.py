"""Beside a voice server: a stock device keeps its upstream while the gateway taps its tools.

``tap`` shares one device's MCP channel between the upstream and the gateway (sans-I/O).
The OTA proxy, the WebSocket relay, the MQTT relay (``mqtt_relay``: one client per device at
its server's broker) and the vision forwarder live beside it, and ``fleet`` offers the server
the other devices' tools; docs/voice-proxy.md tells the whole story, docs/protocol.md §8 the
wire facts.
"""
