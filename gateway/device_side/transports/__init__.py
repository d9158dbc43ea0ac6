"""Transports: each adapts one kind of device link (WebSocket, MQTT) to ``DeviceLink``."""
