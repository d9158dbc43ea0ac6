"""The ``mqtt`` phase of ``fleet.py``: the same N devices at once, three times.

Over WebSocket to a fresh gateway; with the stock OTA check-in, logging in to the embedded
broker with what it returns and listed over MQTT; and the MQTT path's *baseline*
(``_mqtt_baseline``): OTA check-in at a minimal server, mosquitto, one minimal client doing the
discovery. Times, server CPU (mosquitto's and the client's together for the baseline) and RSS
per device right after, for each; with ``--mqtt-idle-seconds``, each gateway's CPU with its
devices connected and idle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _fleet_devices import FleetSpec
from _fleet_processes import Pool
from _fleet_run import DEVICE_TOKEN, LEGEND, device_ids, group_table, incomplete, storm_target
from _mqtt_baseline import MqttBaseline
from _processes import Gateway
from _report import num, ratio

GOAL_RATIO = 1.3  # MQTT devices all listed against the same devices over WebSocket
GOAL_RSS_KB = 50.0


def mqtt(pool: Pool, workdir: Path, count: int, idle_seconds: float = 0.0) -> dict[str, Any]:
    """The same N devices at once: over WebSocket, then OTA + the embedded broker, then
    OTA + mosquitto with a minimal discovery client (the MQTT path's baseline); with
    ``idle_seconds``, each gateway's CPU with its devices connected and idle."""
    ids = device_ids("mqtt", count)
    figures: dict[str, Any] = {"devices": count}
    targets = (("websocket", "ws", False), ("mqtt", "mqtt", True))
    for name, kind, broker in targets:
        gateway = Gateway(workdir, f"mqtt-{name}", DEVICE_TOKEN, mqtt=broker)
        try:
            url = gateway.ota_url if broker else gateway.device_url
            spec = FleetSpec(kind, url, DEVICE_TOKEN)
            figures[name] = storm_target(pool, "mqtt", spec, ids, gateway, idle_seconds)
        finally:
            gateway.close()
    baseline = MqttBaseline(workdir)
    try:
        spec = FleetSpec("mqtt", baseline.ota_url, DEVICE_TOKEN, announce=True)
        figures["mosquitto"] = storm_target(pool, "mqtt", spec, ids, baseline)
    finally:
        baseline.close()
    ws, mq, mo = figures["websocket"], figures["mqtt"], figures["mosquitto"]
    figures["ratio_websocket"] = ratio(mq["listed_s"]["max"], ws["listed_s"]["max"])
    figures["ratio_confirmed"] = ratio(mq.get("confirmed_s"), ws.get("confirmed_s"))
    figures["ratio_mosquitto"] = ratio(mq["listed_s"]["max"], mo["listed_s"]["max"])
    figures["cpu_ratio_websocket"] = ratio(mq["server_cpu_s"], ws["server_cpu_s"])
    figures["cpu_ratio_mosquitto"] = ratio(mq["server_cpu_s"], mo["server_cpu_s"])
    figures["goal_ratio"], figures["goal_rss_kb"] = GOAL_RATIO, GOAL_RSS_KB
    return figures


def _timeline(name: str, t: dict[str, Any]) -> str:
    steps = ("first_reply_s", "connected_s", "asked_s", "listed_s")
    return f"{name} " + " ".join(f"{num(t[k]['p50'])}/{num(t[k]['max'])}" for k in steps)


def mqtt_lines(m: dict[str, Any]) -> list[str]:
    ws, mq, mo = m["websocket"], m["mqtt"], m["mosquitto"]
    rss = "  RSS per device right after: " + ", ".join(
        f"{name} {t['rss_per_device_kb']:.1f} KB" for name, t in
        (("websocket", ws), ("mqtt", mq), ("mosquitto + client", mo))
    ) + f"   goal (mqtt) <= {m['goal_rss_kb']:g} KB"  # fmt: skip
    return [
        f"mqtt: the same {m['devices']} devices at once over WebSocket, over MQTT (OTA check-in, "
        "embedded broker), and over MQTT to mosquitto with a minimal discovery client "
        "(1st = server hello or OTA reply)",
        *group_table({"websocket": ws, "mqtt": mq, "mosquitto": mo}),
        "  timeline, p50/max s of 1st, connected (handshake or CONNACK), asked (first MCP "
        "request), listed: "
        + "; ".join(
            _timeline(name, t) for name, t in (("websocket", ws), ("mqtt", mq), ("mosquitto", mo))
        ),  # fmt: skip
        f"  device workers' CPU: websocket {ws['workers_cpu_s']:.2f} s, mqtt "
        f"{mq['workers_cpu_s']:.2f} s, mosquitto {mo['workers_cpu_s']:.2f} s",
        f"  confirmed via /api/devices: websocket at {num(ws.get('confirmed_s'))} s, mqtt at "
        f"{num(mq.get('confirmed_s'))} s: x{num(m['ratio_confirmed'])}   goal <= "
        f"{m['goal_ratio']:g}x" + incomplete(ws, mq, mo),
        f"  mqtt/websocket (max): x{num(m['ratio_websocket'])}; mqtt/mosquitto (max): "
        f"x{num(m['ratio_mosquitto'])}",
        f"  server CPU: websocket {ws['server_cpu_s']:.2f} s, mqtt {mq['server_cpu_s']:.2f} s, "
        f"mosquitto + client {mo['server_cpu_s']:.2f} s: mqtt x{num(m['cpu_ratio_websocket'])} "
        f"of websocket, x{num(m['cpu_ratio_mosquitto'])} of mosquitto",
        rss,
        *(
            [
                f"  gateway CPU over {mq['idle_seconds']:g} s with the devices idle: websocket "
                f"{ws['idle_cpu_percent']:.2f} %, mqtt {mq['idle_cpu_percent']:.2f} %"
            ]
            if "idle_cpu_percent" in mq
            else []
        ),  # fmt: skip
        f"  gateway logs: websocket {ws['log']}, mqtt {mq['log']}",
        f"  ({LEGEND})",
    ]
