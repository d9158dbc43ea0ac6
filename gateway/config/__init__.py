"""Typed, frozen settings: a TOML file, then ``GATEWAY_*`` environment variables, then CLI flags.

Every key has one name in the file and one in the environment: a top-level key ``device_listen``
is ``GATEWAY_DEVICE_LISTEN``; a key ``timeout`` in table ``[calls]`` is ``GATEWAY_CALLS_TIMEOUT``.
The names DESIGN.md fixes (``GATEWAY_DATA_DIR``, ``GATEWAY_HOST_TOKEN``, ...) fall out of that rule.
Per-device tables (``[devices."<device-id>"]``) come from the file only. Every mistake raises one
``ConfigError`` that names the key, never a traceback.

The modules, in the order they build on each other: ``values`` parses one value, ``listen`` one
``host:port``; ``model`` holds the ``Config`` and ``DeviceOptions`` dataclasses; ``keys`` is the
one list of settings (file key, environment variable, attribute, parser); ``unknown_keys`` refuses
a key no setting has, naming the closest; ``loading`` reads the file, the environment and flags.
"""

from __future__ import annotations

from gateway.config.host_tokens import HostTokenOptions
from gateway.config.keys import (
    ADOPTIONS,
    ENV_PREFIX,
    MQTT_MODES,
    OFFLINE_TOOLS,
    OTA_TRANSPORTS,
    TOOLS_MODES,
    env_name,
    file_key_of,
    settings,
)
from gateway.config.listen import ListenAddress, is_loopback_host
from gateway.config.loading import load_config
from gateway.config.model import Config, DeviceOptions
from gateway.config.values import MIN_HOST_TOKEN, TOKEN_COMMAND

__all__ = [
    "ADOPTIONS",
    "ENV_PREFIX",
    "MIN_HOST_TOKEN",
    "MQTT_MODES",
    "OFFLINE_TOOLS",
    "OTA_TRANSPORTS",
    "TOKEN_COMMAND",
    "TOOLS_MODES",
    "Config",
    "DeviceOptions",
    "HostTokenOptions",
    "ListenAddress",
    "env_name",
    "file_key_of",
    "is_loopback_host",
    "load_config",
    "settings",
]
