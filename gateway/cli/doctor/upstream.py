"""The check of the voice proxy: every voice server the configuration names answers."""

from __future__ import annotations

from gateway.cli.doctor.findings import Context


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
