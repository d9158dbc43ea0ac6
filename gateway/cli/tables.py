"""What ``devices``, ``devices show`` and ``enrollments`` print: plain-text tables from JSON.

No I/O here: ``commands`` fetches the JSON (the dashboard's device summaries and tools, which
count user-only tools too) and prints these lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["DESCRIPTION_WIDTH", "device_table", "enrollment_table", "tool_table"]

DESCRIPTION_WIDTH = 60  # a tool's description is cut to this many characters, on one line


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """``rows`` (a header first) as lines of left-aligned columns."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def device_table(devices: list[dict[str, Any]]) -> list[str]:
    """The ``devices`` table: one row per device summary; no devices, one line saying so."""
    if not devices:
        return ["no devices yet"]
    rows = [("DEVICE", "ID", "STATE", "LAST SEEN", "BOARD", "TOOLS")]
    for d in devices:
        rows.append((d["device"], d["id"], _state(d), d["last_seen"], d["board"] or "-",
                     d["tools"]))  # fmt: skip
    return table(rows)


def tool_table(summary: dict[str, Any], tools: list[dict[str, Any]]) -> list[str]:
    """``devices show``: the device, its counts, and each tool by the name hosts see."""
    lines = [
        f"{summary['device']} ({summary['id']}): {_state(summary)}, "
        f"board {summary['board'] or '-'}, firmware {summary.get('firmware') or '-'}",
        summary["tools"],  # "17 tools for hosts, 3 user-only"
    ]
    if tools:
        rows = [("TOOL", "FOR", "DESCRIPTION")]
        rows += [(t["mcp_name"], _audience(t), shorten(t["description"])) for t in tools]
        lines += ["", *table(rows)]
    lines += [f"rejected {r['tool']}: {r['reason']}" for r in summary.get("rejected", ())]
    return lines


def enrollment_table(enrollments: list[dict[str, Any]]) -> list[str]:
    """``enrollments``: each device token issued for a board, and the device that uses it."""
    if not enrollments:
        return ["no device tokens issued (flash, image and provision ask for one)"]
    rows = [("ID", "NAME", "USED BY", "ISSUED")]
    for e in enrollments:
        used = e["device_id"] or "not used yet"
        if e.get("device") and e["device_id"]:
            used = f"{e['device']} ({e['device_id']})"
        rows.append((e["id"], e["name"], used, e["issued"]))
    return table(rows)


def shorten(text: str, width: int = DESCRIPTION_WIDTH) -> str:
    """``text`` on one line, cut at ``width`` characters with "..." when longer."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def _audience(tool: dict[str, Any]) -> str:
    """Who may call the tool: hosts (the model), the user only, or nobody (policy)."""
    if tool["model_refusal"] is None:
        return "hosts"
    return "user-only" if tool["user_refusal"] is None else "denied"


def _state(d: dict[str, Any]) -> str:
    state = "online" if d["online"] else "offline"
    return state + (f", {d['status']}" if d["status"] in ("pending", "rejected") else "")
