"""The ``list`` phase of ``fleet.py``: a host fetching every ``tools/list`` page of a fleet.

For each of ``--list-counts`` fleets (1,000 and 10,000 devices), the wall time of an SDK client
fetching every page of a gateway in ``per-device`` tools mode (25 tools a device, plus its four
meta-tools), against the *baseline* of a bare low-level SDK ``Server`` in its own process
listing the same tools, prebuilt and paged alike (``_listing_baseline``); ``--list-passes``
passes each, alternating targets, with each server's CPU over each pass.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from pathlib import Path
from typing import Any

from _fleet_catalogue import TOOL_COUNT
from _fleet_processes import ListBaseline, Pool
from _fleet_run import DEVICE_TOKEN, device_ids, patient, run_group, summarize
from _listing_baseline import PAGE_BYTES, Listed, list_all, pass_figures
from _processes import Gateway, cpu_s
from _report import num, ratio
from mcp import Client

LIST_SETTINGS = {"GATEWAY_TOOLS_MODE": "per-device"}  # every device tool listed by its own name
LIST_META_TOOLS = 4  # list_devices, call_device_tool, wait_for_event, notify_device: page one
LIST_MAX = 0xFFFF  # aliases end in the id's last 4 hex digits: beyond, the gateway numbers them
GOAL_RATIO = 1.5


async def _list_passes(targets: dict[str, tuple[str, int]], passes: int) -> dict[str, list[Listed]]:
    """``passes`` whole listings per target (URL, server pid), alternating who goes first.

    One SDK session per target. Each pass also takes the server's CPU time over it; the first
    pass measures page sizes (outside the timing) and keeps the names.
    """
    done: dict[str, list[Listed]] = {name: [] for name in targets}
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            name: await stack.enter_async_context(Client(url, mode="legacy"))
            for name, (url, _) in targets.items()
        }
        order = list(targets)
        for index in range(passes):
            for name in order:
                first, pid = index == 0, targets[name][1]
                cpu = cpu_s(pid)
                listed = await list_all(clients[name], sizes=first, names=first)
                listed.server_cpu_s = cpu_s(pid) - cpu
                done[name].append(listed)
            order.reverse()
    return done


def _target(passes: list[Listed]) -> dict[str, Any]:
    later, cpu = [p.seconds for p in passes[1:]], [p.server_cpu_s for p in passes[1:]]
    return {
        "first": pass_figures(passes[0]),
        "later_s": [round(s, 3) for s in later],
        "later_median_s": round(statistics.median(later), 3) if later else None,
        "later_server_cpu_s": round(statistics.median(cpu), 2) if cpu else None,
    }


def list_fleet(pool: Pool, workdir: Path, count: int, passes: int) -> dict[str, Any]:
    """Every tools/list page of a fleet of ``count`` devices: the baseline, then the gateway."""
    ids = device_ids("list", count)
    figures: dict[str, Any] = {"devices": count, "expected_tools": count * TOOL_COUNT
                               + LIST_META_TOOLS}  # fmt: skip
    baseline = ListBaseline(ids)  # made and paged before the gateway starts
    try:
        figures["baseline_build_s"] = round(baseline.build_s, 2)
        gateway = Gateway(workdir, f"list-{count}", DEVICE_TOKEN, mqtt=False,
                          settings=LIST_SETTINGS)  # fmt: skip
        try:
            run = run_group(pool, "list", patient(gateway), ids, gateway)
            fill = summarize(run)
            figures["fill"] = {k: fill[k] for k in ("listed", "listed_s", "failed")}
            gateway.settle()  # the last catalogues are taken; no listing is made yet
            targets = {
                "baseline": (baseline.url, baseline.pid),
                "gateway": (gateway.mcp_url, gateway.pid),
            }
            done = asyncio.run(_list_passes(targets, passes))
            baseline.check()
            gateway.check()
            figures["log"] = gateway.log_counts()
            figures["rss_kb"] = gateway.rss_kb()
            pool.stop("list")
        finally:
            gateway.close()
    finally:
        baseline.close()
    for name in ("baseline", "gateway"):
        figures[name] = _target(done[name])
    figures["same_names"] = done["baseline"][0].names == done["gateway"][0].names
    base, gw = figures["baseline"], figures["gateway"]
    figures["ratio_first"] = ratio(gw["first"]["seconds"], base["first"]["seconds"])
    figures["ratio_later"] = ratio(gw["later_median_s"], base["later_median_s"])
    # The servers' own work, which machine load disturbs less than the wall times.
    first = base["first"]["server_cpu_s"], gw["first"]["server_cpu_s"]
    figures["cpu_ratio_first"] = ratio(first[1], first[0])
    figures["cpu_ratio_later"] = ratio(gw["later_server_cpu_s"], base["later_server_cpu_s"])
    return figures


def listing(pool: Pool, workdir: Path, args: argparse.Namespace, figures: dict[str, Any]) -> None:
    """The list phase: a fresh gateway and baseline per fleet size.

    Each fleet's figures go into ``figures["list"]`` as it ends: a later fleet may break the run.
    """
    fleets: list[dict[str, Any]] = []
    figures["list"] = {"passes": args.list_passes, "page_bytes": PAGE_BYTES, "fleets": fleets,
                       "goal_ratio": GOAL_RATIO}  # fmt: skip
    for count in args.list_counts:
        fleets.append(list_fleet(pool, workdir, count, args.list_passes))


def _list_row(name: str, t: dict[str, Any], ratios: str = "") -> str:
    first = t["first"]
    largest = first["largest_page_bytes"] / 1000
    return (
        f"    {name:<10}{first['tools']:>9,}{first['pages']:>7}{largest:>9.1f} KB"
        f"{first['seconds']:>9.2f}{num(t['later_median_s']):>9}"
        f"{first['server_cpu_s']:>9.2f}{num(t['later_server_cpu_s']):>9}{ratios}"
    )


def list_lines(li: dict[str, Any]) -> list[str]:
    later = f"median of passes 2-{li['passes']}" if li["passes"] > 2 else "pass 2"
    lines = [
        f"list: every tools/list page, SDK client (legacy, streamable HTTP); gateway in "
        f"per-device mode; pages of ~{li['page_bytes'] / 1000:g} KB; 1st pass, later = {later}",
        f"    {'':<10}{'tools':>9}{'pages':>7}{'largest':>12}{'1st s':>9}{'later s':>9}"
        f"{'cpu 1st':>9}{'later':>9}{'x 1st':>8}{'x later':>9}",
    ]
    for f in li["fleets"]:
        fill = f["fill"]
        failed = ", ".join(f"{k} {v}" for k, v in fill["failed"].items()) or "none failed"
        lines.append(
            f"  {f['devices']:,} devices ({fill['listed']:,} listed in "
            f"{num(fill['listed_s']['max'])} s, {failed}; {f['expected_tools']:,} tools expected)"
        )
        ratios = f"{'x' + num(f['ratio_first']):>8}{'x' + num(f['ratio_later']):>9}"
        lines.append(_list_row("baseline", f["baseline"]))
        lines.append(_list_row("gateway", f["gateway"], ratios))
        problems = [
            f"{name} listed {t['first']['tools']:,} tools ({t['first']['unique']:,} distinct)"
            for name, t in (("baseline", f["baseline"]), ("gateway", f["gateway"]))
            if not t["first"]["tools"] == t["first"]["unique"] == f["expected_tools"]
        ]
        if not f["same_names"]:
            problems.append("the two listings differ in names")
        log = f["log"]
        if log["warnings"] or log["errors"]:
            problems.append(f"gateway log: {log['warnings']} warnings, {log['errors']} errors")
        lines += [f"    !! {p}" for p in problems]
        lines.append(
            f"    server CPU gateway/baseline: x{num(f['cpu_ratio_first'])} 1st pass, "
            f"x{num(f['cpu_ratio_later'])} later"
        )
    lines.append(
        f"  x = gateway/baseline wall time, goal <= {li['goal_ratio']:g}x; cpu = the server's "
        "CPU seconds over the pass (the rest is the client)"
    )
    return lines
