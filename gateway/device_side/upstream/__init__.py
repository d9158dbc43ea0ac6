"""Beside a voice server: a stock device keeps its upstream while the gateway taps its tools.

``tap`` shares one device's MCP channel between the upstream and the gateway (sans-I/O).
The OTA proxy, the WebSocket relay and the vision forwarder live beside it; docs/voice-proxy.md
tells the whole story, docs/protocol.md §8 the wire facts.
"""
