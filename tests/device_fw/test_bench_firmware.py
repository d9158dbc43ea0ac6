"""bench/firmware.py still runs (its figures are read by people, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import bound, program

BENCH = Path(__file__).resolve().parent.parent.parent / "bench" / "firmware.py"


@pytest.mark.e2e
def test_firmware_benchmark_reports_heap_sizes_and_call_times() -> None:
    """`bench/firmware.py --json` measures heap, file sizes and tools/call times."""
    program("micropython")
    done = subprocess.run(
        [sys.executable, str(BENCH), "--calls", "10", "--json"],
        capture_output=True,
        text=True,
        timeout=bound(300),
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["tools"] == 10
    assert 0 < figures["heap_core_10_tools"] < figures["heap_firmware_from_py"]
    assert 0 < figures["mpy_bytes"] < figures["source_bytes"]
    assert figures["round_trip_ms"]["calls"] == 10 and figures["handle_us"] > 0
