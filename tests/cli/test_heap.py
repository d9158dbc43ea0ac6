"""Tests for gateway.cli.heap: a running gateway's heap leaves start-up out of collections."""

from __future__ import annotations

import subprocess
import sys

from gateway.cli.heap import THRESHOLDS


def test_settle_freezes_start_up_and_collects_less_often() -> None:
    """After settle(), a full collection no longer walks what start-up made (so it costs what
    the devices and sessions cost), and young objects are collected in bigger batches."""
    script = (
        "import gc, gateway.app\n"
        "from gateway.cli.heap import settle\n"
        "before = len(gc.get_objects())\n"
        "settle()\n"
        "print(before, gc.get_freeze_count(), len(gc.get_objects()), *gc.get_threshold())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    before, frozen, tracked, *thresholds = map(int, out.stdout.split())
    assert frozen > before // 2 and tracked < 1000  # start-up's objects are out of collections
    assert tuple(thresholds) == THRESHOLDS
