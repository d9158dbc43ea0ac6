"""The check of the voice proxy: every voice server the configuration names answers, and the
MQTT broker of every voice server a device was told to use through the gateway."""

from __future__ import annotations

from gateway.cli.doctor.findings import Context
from gateway.device_side.upstream.mqtt_settings import MqttUpstreams, UpstreamMqtt


def check_upstream(ctx: Context) -> None:
    """Each ``[upstream]`` OTA URL (the default and the devices' own) answers HTTP."""
    config = ctx.config
    urls = {config.upstream_ota_url} | {o.upstream for o in config.devices.values()}
    topic = "voice servers"
    for url in sorted(u for u in urls if isinstance(u, str) and u != "default"):
        try:
            answer = ctx.probes.upstream(url, ctx.probes.timeout * 2)
        except OSError as exc:
            ctx.add(
                "problem",
                topic,
                f"the voice server at {url} does not answer ({exc}): proxied devices cannot "
                "check in (they keep their last settings) nor start a conversation",
                "check the URL ([upstream] ota_url, or a device's upstream) and this machine's "
                "way to it (DNS, firewall, proxy)",
            )
        else:
            ctx.add("ok", topic, f"the voice server at {url} answers ({answer})")


def check_upstream_brokers(ctx: Context) -> None:
    """The upstream brokers kept for MQTT devices (``upstream_mqtt.json``) can be reached.

    Reached only (TCP, and TLS on 8883): the login is the device's own account at its server.
    """
    brokers: dict[str, tuple[UpstreamMqtt, list[str]]] = {}  # by server: one probe for all
    for device_id, settings in MqttUpstreams(ctx.config.data_dir).items():
        brokers.setdefault(settings.server, (settings, []))[1].append(device_id)
    topic = "voice servers"
    for server, (settings, ids) in sorted(brokers.items()):
        named = ", ".join(ids)
        why = ctx.probes.broker(settings.host, settings.port, settings.tls, ctx.probes.timeout * 2)
        if why is None:
            how = "TLS handshake done" if settings.tls else "TCP"
            ctx.add("ok", topic, f"the MQTT broker {server} of the voice server of {named} "
                                 f"can be reached ({how})")  # fmt: skip
            continue
        ctx.add(
            "problem",
            topic,
            f"the MQTT broker {server} of the voice server of {named} cannot be reached "
            f"({why}): the gateway cannot relay their conversations",
            "check this machine's way to it (DNS, firewall, proxy, CAs for TLS); a device's "
            "server gives new broker settings at its next check-in (restart the device)",
        )
