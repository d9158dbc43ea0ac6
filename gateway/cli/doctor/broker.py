"""The checks of MQTT: the broker answers, and devices are told an address they can reach."""

from __future__ import annotations

from gateway.cli.doctor.findings import LAN_EXAMPLE, Context
from gateway.config import is_loopback_host
from gateway.net.addresses import is_wildcard, local_host


def check_broker(ctx: Context, running: bool) -> None:
    """The broker devices use answers (the embedded one: once the gateway runs)."""
    config = ctx.config
    probe = ctx.probes
    topic = "MQTT broker"
    if config.mqtt_broker == "external":
        where = f"{config.mqtt_host}:{config.mqtt_port}"
        why = probe.tcp(config.mqtt_host, config.mqtt_port, probe.timeout)
        if why is None:
            ctx.add("ok", topic, f"the external broker answers at {where}")
        else:
            ctx.add(
                "problem",
                topic,
                f"the external broker at {where} does not answer ({why})",
                "start the broker, or fix GATEWAY_MQTT_HOST / GATEWAY_MQTT_PORT (in Docker "
                "Compose: the broker's service name, e.g. mosquitto)",
            )
        return
    if config.mqtt_broker is None or config.mqtt_listen is None:
        ctx.add("info", topic, "MQTT is off: devices can connect over WebSocket only")
        return
    address = config.mqtt_listen
    if address.port == 0:
        ctx.add(
            "problem",
            topic,
            f"{address}: port 0 picks a new port at every start, so devices cannot know it",
            f"set GATEWAY_MQTT_LISTEN={address.host}:1883",
        )
        return
    why = probe.tcp(local_host(address.host), address.port, probe.timeout)
    if running and why is not None:
        ctx.add(
            "problem",
            topic,
            f"the gateway runs but its embedded broker does not answer on {address} ({why})",
            "read the gateway's log for why it did not start (port taken by another broker?)",
        )
    elif running:
        ctx.add("ok", topic, f"the embedded broker answers on {address}")
    elif why is None:
        ctx.add(
            "problem",
            topic,
            f"another program (an MQTT broker?) already listens on {address}: the embedded "
            "broker cannot start there",
            'stop it, or use it ([mqtt] mode = "external"), or move the embedded broker '
            "(GATEWAY_MQTT_LISTEN=0.0.0.0:1884, or off)",
        )
    else:
        ctx.add("info", topic, f"{address} is free for the embedded broker")


def check_broker_endpoint(ctx: Context) -> None:
    """What stock devices are told for MQTT: it must be an address they can reach."""
    config = ctx.config
    if config.mqtt_broker is None:
        return
    topic = "MQTT endpoint"
    endpoint = config.mqtt_public_endpoint
    if endpoint is None:
        if config.mqtt_broker == "embedded":
            return  # derived from public_url, checked above
        host, shown = config.mqtt_host, f"{config.mqtt_host}:{config.mqtt_port}"
    else:
        host, shown = endpoint.partition(":")[0], endpoint
    fix = f"set GATEWAY_MQTT_PUBLIC_ENDPOINT to an address devices reach, e.g. {LAN_EXAMPLE}:1883"
    if is_loopback_host(host) or is_wildcard(host):
        ctx.add(
            "problem",
            topic,
            f"devices are told to use the broker at {shown}, which is not "
            "an address they can reach",
            fix,
        )
    elif "." not in host and ":" not in host and endpoint is None:
        ctx.add(
            "warning",
            topic,
            f"devices are told to use the broker at {shown}; a short name "
            "like that resolves inside Docker networks, rarely on devices",
            fix,
        )
    elif host.endswith(".local"):
        ctx.add(
            "warning",
            topic,
            f"{shown}: ESP32 firmware usually cannot resolve mDNS .local names",
            fix,
        )
    else:
        ctx.add("ok", topic, f"devices are told to use the broker at {shown}")
