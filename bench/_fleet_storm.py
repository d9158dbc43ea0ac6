"""The ``storm`` phase of ``fleet.py``: N devices connect at once over WebSocket.

First to the *baseline* (a bare ``websockets`` server in its own process doing only the device
handshake: server hello, ``initialize``, three ``tools/list`` pages), then to the *lean*
baseline (the same with everything serialised once and no JSON parsed: ``_lean_baseline``),
then to a fresh gateway. Device side: when each device answered its last page (p50, max).
Gateway side: once the devices are done, ``GET /api/devices`` every half second until all are
online with 25 tools. ``--storm-rounds`` > 1: that many storms of the lean baseline and a fresh
gateway in all, taking turns at going first, for the median of their CPU ratios.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from _fleet_devices import FleetSpec
from _fleet_processes import Baseline, Pool
from _fleet_run import (
    DEVICE_TOKEN,
    LEGEND,
    device_ids,
    group_table,
    incomplete,
    log_lines,
    run_group,
    storm_target,
    summarize,
)
from _processes import Gateway
from _report import num, ratio

GOAL_RATIO = 2.0  # the last device listed, against the baseline's
GOAL_CPU_RATIO_LEAN = 1.15  # storm server CPU against the lean baseline's (issue 29)


def storm(pool: Pool, workdir: Path, count: int, rounds: int = 1) -> dict[str, Any]:
    """N devices at once: the baseline server, then the gateway; ``rounds`` > 1: that many
    storms of the lean baseline and a fresh gateway in all, for the median of their ratios."""
    ids = device_ids("storm", count)
    stock = FleetSpec("ws", "", DEVICE_TOKEN)  # stock patience: 10 s, 10 s
    figures: dict[str, Any] = {"devices": count}
    for name, lean in (("baseline", False), ("lean", True)):
        baseline = Baseline(DEVICE_TOKEN, lean=lean)
        try:
            run = run_group(pool, "storm", replace(stock, url=baseline.url), ids, baseline)
            figures[name] = summarize(run)
            pool.stop("storm")
        finally:
            baseline.close()
    gateway = Gateway(workdir, "storm", DEVICE_TOKEN, mqtt=False)
    try:
        spec = replace(stock, url=gateway.device_url)
        figures["gateway"] = storm_target(pool, "storm", spec, ids, gateway)
    finally:
        gateway.close()
    base, lean, gw = (figures[name] for name in ("baseline", "lean", "gateway"))
    figures["ratio"] = ratio(gw["listed_s"]["max"], base["listed_s"]["max"])
    figures["cpu_ratio"] = ratio(gw["server_cpu_s"], base["server_cpu_s"])
    figures["cpu_ratio_lean"] = ratio(gw["server_cpu_s"], lean["server_cpu_s"])
    figures["goal_ratio"] = GOAL_RATIO
    figures["goal_cpu_ratio_lean"] = GOAL_CPU_RATIO_LEAN
    if rounds > 1:
        figures |= _more_rounds(pool, workdir, stock, ids, figures, rounds)
    return figures


def _more_rounds(
    pool: Pool, workdir: Path, stock: FleetSpec, ids: list[str], first: dict[str, Any],
    rounds: int,
) -> dict[str, Any]:  # fmt: skip
    """Rounds 2..``rounds`` of the storm against the lean baseline and a fresh gateway: their
    CPU, and the median of every round's ratio.

    One storm's ratio moves by a third from run to run on a shared machine (bench/README.md),
    and the second server of a pair tends to be the slower: the rounds take turns at going
    first (the gateway in even rounds, the lean baseline in odd ones).
    """
    done = [_round(first["lean"], first["gateway"])]
    for number in range(2, rounds + 1):
        cpu: dict[str, dict[str, Any]] = {}
        for target in ("gateway", "lean") if number % 2 == 0 else ("lean", "gateway"):
            if target == "lean":
                server: Baseline | Gateway = Baseline(DEVICE_TOKEN, lean=True)
                url = server.url
            else:
                server = Gateway(workdir, f"storm{number}", DEVICE_TOKEN, mqtt=False)
                url = server.device_url
            try:
                cpu[target] = summarize(run_group(pool, "storm", replace(stock, url=url), ids,
                                                  server))  # fmt: skip
                pool.stop("storm")
            finally:
                server.close()
        done.append(_round(cpu["lean"], cpu["gateway"]))
    ratios = [r["cpu_ratio_lean"] for r in done if r["cpu_ratio_lean"] is not None]
    return {
        "rounds": done,
        "cpu_ratio_lean_median": round(statistics.median(ratios), 2) if ratios else None,
    }


def _round(lean: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """One round's CPU; its ratio only when every device was listed by both servers."""
    whole = lean["listed"] == lean["devices"] and gateway["listed"] == gateway["devices"]
    lean_s, gateway_s = lean["server_cpu_s"], gateway["server_cpu_s"]
    ratio = round(gateway_s / lean_s, 2) if whole and lean_s and gateway_s else None
    return {"lean_cpu_s": lean_s, "gateway_cpu_s": gateway_s, "cpu_ratio_lean": ratio}


def storm_lines(f: dict[str, Any]) -> list[str]:
    return [
        f"storm: {f['devices']} WebSocket devices at once (times from the start; "
        "1st = server hello)",
        *group_table({name: f[name] for name in ("baseline", "lean", "gateway")}),
        *log_lines(f["gateway"]),
        f"  gateway/baseline (max): x{num(f['ratio'])}   goal <= {f['goal_ratio']:g}x"
        + incomplete(f["baseline"], f["lean"], f["gateway"]),
        f"  server CPU: baseline {f['baseline']['server_cpu_s']:.2f} s, lean "
        f"{f['lean']['server_cpu_s']:.2f} s, gateway {f['gateway']['server_cpu_s']:.2f} s: "
        f"x{num(f['cpu_ratio'])} of the baseline, x{num(f['cpu_ratio_lean'])} of the lean one "
        f"(goal <= {f['goal_cpu_ratio_lean']:g}x)",
        *_rounds_lines(f),
        f"  gateway RSS {f['gateway']['rss_before_kb'] / 1024:.1f} MB before, "
        f"{f['gateway']['rss_after_kb'] / 1024:.1f} MB right after: "
        f"{f['gateway']['rss_per_device_kb']:.1f} KB per device",
        f"  ({LEGEND})",
    ]


def _rounds_lines(f: dict[str, Any]) -> list[str]:
    if "rounds" not in f:
        return []
    ratios = ", ".join(f"x{num(r['cpu_ratio_lean'])}" for r in f["rounds"])
    return [
        f"  {len(f['rounds'])} rounds, gateway CPU / lean (the gateway first in even rounds): "
        f"{ratios}; median x{num(f['cpu_ratio_lean_median'])} "
        f"(goal <= {f['goal_cpu_ratio_lean']:g}x)"
    ]
