"""Tests for gateway.host_side.metrics: calls counted without costing each call a histogram."""

from __future__ import annotations

from pathlib import Path

import gateway.host_side.metrics as metrics
from gateway.host_side.metrics import GatewayMetrics
from tests.conftest import make_config
from tests.fakes import Stack


def _count(gm: GatewayMetrics, outcome: str) -> float:
    value = gm.registry.get_sample_value("gateway_calls_total", {"outcome": outcome})
    return value or 0.0


def test_calls_are_counted_by_the_next_scrape_or_once_enough_are_held(tmp_path: Path) -> None:
    """A call is held until the next scrape counts it; a gateway nobody scrapes counts every
    ``_HELD_CALLS`` calls, so what it holds stays bounded (issue 29)."""
    stack = Stack(make_config(tmp_path))
    try:
        gm = GatewayMetrics(stack.registry.known, stack.audit, mcp_sessions=lambda: 0)
        for _ in range(metrics._HELD_CALLS - 1):
            gm.call_ended("ok", 0.02)
        assert _count(gm, "ok") == 0  # held: the calls paid an append each
        gm.call_ended("DeviceTimeout", 30.0)  # the last one of a batch
        assert _count(gm, "ok") == metrics._HELD_CALLS - 1
        assert _count(gm, "DeviceTimeout") == 1
        gm.call_ended("ok", 0.02)
        gm._count_calls()  # what a scrape does first
        assert _count(gm, "ok") == metrics._HELD_CALLS
        seconds = gm.registry.get_sample_value("gateway_call_duration_seconds_count")
        assert seconds == metrics._HELD_CALLS + 1
    finally:
        stack.close()
