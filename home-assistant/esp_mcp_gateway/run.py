"""The add-on's entry point: Home Assistant's options become the gateway's settings.

Home Assistant writes what the user set on the add-on's Configuration tab to
/data/options.json. Each option maps to one ``GATEWAY_*`` variable (``ENVIRONMENT``); the rest
comes from the image (both listeners on every interface, the data dir on /data). Run as root,
this makes /data the gateway user's, then becomes that user and runs ``esp-mcp-gateway serve``.
A missing host token stops it with a message saying where to set it. An option under its former
name (``FORMER_OPTIONS``) still works, and the log says its new name once.

Remote access is two options: ``remote_url`` (the gateway's ``[host] remote_url``, the https
tunnel to the MCP port that remote apps' sign-in is issued for) and ``http_networks`` (added to
Home Assistant's own network, which may always get tokens over plain HTTP). ``device_url`` stays
what boards are told: a tunnel carries only the MCP port.

With ``mqtt_mode: external`` and no ``mqtt_host``, the broker and its login are Home Assistant's
MQTT service (config.yaml ``services: mqtt:want``; the Mosquitto add-on provides it), asked of
the Supervisor's API with the token it gives every add-on: nothing to type.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

OPTIONS = Path("/data/options.json")
DATA = Path("/data")
GATEWAY_UID = 10001  # the image's gateway user (Dockerfile: ARG UID)
HOST_PORT = 8766
SUPERVISOR_MQTT = "http://supervisor/services/mqtt"

# option -> environment variable; options left empty keep the gateway's defaults.
ENVIRONMENT = {
    "host_token": "GATEWAY_HOST_TOKEN",
    "device_url": "GATEWAY_DEVICE_URL",
    "remote_url": "GATEWAY_HOST_REMOTE_URL",
    "http_networks": "GATEWAY_OAUTH_HTTP_NETWORKS",
    "mqtt_mode": "GATEWAY_MQTT_MODE",
    "mqtt_host": "GATEWAY_MQTT_HOST",
    "mqtt_port": "GATEWAY_MQTT_PORT",
    "mqtt_username": "GATEWAY_MQTT_USERNAME",
    "mqtt_password": "GATEWAY_MQTT_PASSWORD",
    "mqtt_public_endpoint": "GATEWAY_MQTT_PUBLIC_ENDPOINT",
    "upstream_ota_url": "GATEWAY_UPSTREAM_OTA_URL",
    "log_level": "GATEWAY_LOG_LEVEL",
}
# Options renamed, still read under their former names (config.yaml keeps them in its schema).
FORMER_OPTIONS = {"public_url": "device_url"}


# Set whatever the options say. Home Assistant documents that ingress requests come from the
# Supervisor's 172.30.32.2 only: the dashboard trusts that peer (HA signed its user in already),
# and no other. HA's own MCP client reaches the add-on over its internal network (172.30.32.0/23)
# in plain HTTP, where the gateway may then issue it OAuth tokens (with the user's http_networks).
HOME_ASSISTANT = {
    "GATEWAY_HOST_INGRESS_PEERS": "172.30.32.2",
    "GATEWAY_OAUTH_HTTP_NETWORKS": "172.30.32.0/23",
}


class OptionsError(Exception):
    """The options cannot run the gateway; the message says what to change, and where."""


def environment(options: dict[str, Any]) -> dict[str, str]:
    """The ``GATEWAY_*`` variables for ``options`` (under their current names).

    Raises:
        OptionsError: the host token is missing, or an option is not one the add-on knows.
    """
    unknown = sorted(set(options) - set(ENVIRONMENT))
    if unknown:
        raise OptionsError(f"unknown option(s) {', '.join(unknown)}")
    if not str(options.get("host_token") or "").strip():
        raise OptionsError(
            "set host_token on the add-on's Configuration tab (MCP hosts send it as a bearer "
            "token; make one with: python3 -c 'import secrets; print(secrets.token_hex(32))')"
        )
    env = {
        ENVIRONMENT[key]: str(value).strip()
        for key, value in options.items()
        if value is not None and str(value).strip() != ""
    }
    if env.get("GATEWAY_MQTT_MODE") != "embedded":
        env["GATEWAY_MQTT_LISTEN"] = "off"  # no broker in the add-on unless asked for
    own = env.get("GATEWAY_OAUTH_HTTP_NETWORKS")
    env.update(HOME_ASSISTANT)
    if own:  # the user's networks beside HA's own, which HA's MCP client needs
        env["GATEWAY_OAUTH_HTTP_NETWORKS"] += f",{own}"
    return env


def current_names(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` under their current names; a former name is said once, with the new one."""
    renamed = dict(options)
    for former, current in FORMER_OPTIONS.items():
        if former in renamed:
            value = renamed.pop(former)
            print(f"esp-mcp-gateway add-on: option {former} is now {current} (set it there; "
                  f"{former} still works)", file=sys.stderr)  # fmt: skip
            if renamed.get(current) in (None, ""):
                renamed[current] = value
    return renamed


def wants_supervisor_mqtt(options: dict[str, Any]) -> bool:
    """External MQTT with no broker named: the one Home Assistant's MQTT service names."""
    return options.get("mqtt_mode") == "external" and not str(options.get("mqtt_host") or "")


def supervisor_mqtt(service: dict[str, Any]) -> dict[str, str]:
    """The ``GATEWAY_MQTT_*`` settings of the Supervisor's MQTT service answer
    (``{"data": {"host", "port", "username", "password", "ssl"}}``).

    Raises:
        OptionsError: there is no MQTT service (no broker add-on), or it names no broker.
    """
    data = service.get("data") or {}
    if not data.get("host"):
        raise OptionsError(
            "mqtt_mode is external but Home Assistant has no MQTT broker: install the Mosquitto "
            "broker add-on, or set mqtt_host (and its login) on the Configuration tab"
        )
    env = {"GATEWAY_MQTT_HOST": str(data["host"]), "GATEWAY_MQTT_PORT": str(data.get("port", 1883))}
    if data.get("username"):
        env["GATEWAY_MQTT_USERNAME"] = str(data["username"])
        env["GATEWAY_MQTT_PASSWORD"] = str(data.get("password") or "")
    env["GATEWAY_MQTT_TLS"] = "true" if data.get("ssl") else "false"
    return env


def ask_supervisor(url: str, token: str) -> dict[str, Any]:
    """GET ``url`` of the Supervisor's API with the add-on's token."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            found: dict[str, Any] = json.loads(answer.read())
            return found
    except urllib.error.HTTPError as exc:
        if exc.code in (400, 404):  # no provider of the service: no broker add-on
            return {}
        raise OptionsError(f"the Supervisor refused the MQTT service: HTTP {exc.code}") from exc
    except (OSError, ValueError) as exc:
        raise OptionsError(f"cannot ask the Supervisor for the MQTT broker: {exc}") from exc


def mcp_url(options: dict[str, Any]) -> str:
    """Where MCP hosts reach the add-on: the device URL's host on the host listener's port."""
    host = urllib.parse.urlsplit(str(options.get("device_url") or "")).hostname
    return f"http://{host or '<Home Assistant address>'}:{HOST_PORT}/mcp"


def own_data_dir(root: Path, uid: int) -> None:
    """Make ``root`` and all in it the gateway user's (Home Assistant mounts it as root's)."""
    for path in [root, *root.rglob("*")]:
        if path.name != "options.json":  # Home Assistant's, kept as it is
            os.chown(path, uid, uid, follow_symlinks=False)


def main() -> None:
    try:
        options = current_names(json.loads(OPTIONS.read_text(encoding="utf-8")))
        env = environment(options)
        if wants_supervisor_mqtt(options):
            token = os.environ.get("SUPERVISOR_TOKEN", "")
            env.update(supervisor_mqtt(ask_supervisor(SUPERVISOR_MQTT, token)))
            print(f"esp-mcp-gateway add-on: MQTT broker {env['GATEWAY_MQTT_HOST']}:"
                  f"{env['GATEWAY_MQTT_PORT']} from Home Assistant", file=sys.stderr)  # fmt: skip
    except (OSError, ValueError, OptionsError) as exc:
        print(f"esp-mcp-gateway add-on: cannot start: {exc}", file=sys.stderr)
        sys.exit(1)
    print(f"esp-mcp-gateway add-on: MCP hosts connect to {mcp_url(options)} "
          "with the host token as 'Authorization: Bearer'", file=sys.stderr)  # fmt: skip
    if os.getuid() == 0:
        own_data_dir(DATA, GATEWAY_UID)
        os.setgroups([])
        os.setgid(GATEWAY_UID)
        os.setuid(GATEWAY_UID)
    os.execvpe("esp-mcp-gateway", ["esp-mcp-gateway", "serve"], {**os.environ, **env})


if __name__ == "__main__":
    main()
