"""The device's settings: config.json on the board, merged over DEFAULTS.

config.example.json documents every key. The file is looked up as FW_CONFIG (environment, on
the unix port and CPython) or config.json in the current directory (the board's root).
"""

import json

import fw_compat as compat

VERSION = "0.1.0"

DEFAULTS = {
    "name": "",
    "wifi": {"ssid": "", "password": ""},
    "transport": "ws",
    "url": "",
    "token": "",
    "mqtt": {"host": "", "port": 1883, "prefix": "xiaozhi", "keepalive": 60, "tls": False},
    "device_id": "",
    "client_id": "",
    "board": "auto",
    "pins": {
        "outputs": {"led": 2},
        "adc": None,
        "neopixel": None,
        "neopixel_count": 1,
        "buzzer": None,
        "display": None,
    },
    "camera": False,
    "tools": [],
    "ping_interval": 30,
    "backoff": [1, 30],
    "log": "info",
    "console": False,
}


def merge(defaults, values):
    """``values`` over ``defaults``; nested objects are merged one level deep."""
    merged = {}
    for key, default in defaults.items():
        value = values.get(key, default)
        if isinstance(default, dict) and isinstance(value, dict):
            inner = dict(default)
            inner.update(value)
            value = inner
        merged[key] = value
    for key in values:
        if key not in merged:
            compat.log(compat.WARNING, "config: unknown key %r ignored", key)
    return merged


def check(config):
    """Raise ValueError for settings the device cannot run with."""
    transport = config["transport"]
    if transport not in ("ws", "mqtt"):
        raise ValueError('config: transport must be "ws" or "mqtt", not %r' % transport)
    if transport == "ws" and not config["url"].startswith(("ws://", "wss://")):
        raise ValueError("config: url must be the gateway's ws://host:8765/xiaozhi/v1/")
    if transport == "mqtt" and not config["mqtt"]["host"]:
        raise ValueError('config: mqtt.host is required with transport "mqtt"')
    return config


def load(path=None):
    """The settings from ``path`` (or FW_CONFIG, or config.json) over the defaults."""
    path = path or compat.getenv("FW_CONFIG") or "config.json"
    try:
        with open(path) as handle:
            values = json.load(handle)
    except OSError:
        compat.log(compat.WARNING, "config: %s not found, using the defaults", path)
        values = {}
    return check(merge(DEFAULTS, values))


def client_id(config, path="client_id"):
    """The Client-Id header: a UUIDv4 made once and kept in a file, as stock keeps it in NVS."""
    if config["client_id"]:
        return config["client_id"]
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        pass
    raw = bytearray(compat.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40
    raw[8] = raw[8] & 0x3F | 0x80
    text = "".join("%02x" % byte for byte in raw)
    made = "-".join((text[:8], text[8:12], text[12:16], text[16:20], text[20:]))
    try:
        with open(path, "w") as handle:
            handle.write(made)
    except OSError:
        compat.log(compat.WARNING, "cannot keep the Client-Id in %s", path)
    return made
