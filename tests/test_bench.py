"""The benchmarks still run (their figures are read by people, never asserted here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from tests.conftest import bound

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.anyio
@pytest.mark.e2e
async def test_call_latency_benchmark_runs_and_reports_both_targets() -> None:
    """`bench/call_latency.py --json` measures both targets and prints their ratio."""
    with anyio.fail_after(bound(120)):
        done = await anyio.run_process(
            [sys.executable, str(BENCH / "call_latency.py"), "--calls", "4", "--json"], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    figures = json.loads(done.stdout)
    assert figures["baseline"]["calls"] == figures["gateway"]["calls"] == 4
    assert figures["ratio"]["median"] > 0
