"""Bounds scale with the machine by themselves, and a test that runs out of one says how to
widen them (tests/bounds.py, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import bounds
from tests.conftest import bound, run_with_suite_plugin


def test_a_busy_machine_stretches_every_bound() -> None:
    """Load per CPU is the factor: 6 runnable on 2 CPUs waits three times as long."""
    assert bounds.machine_factor(load=6.0, cpu_count=2) == 3.0
    assert bounds.machine_factor(load=0.5, cpu_count=2) == 1.0  # idle: never shorter
    assert bounds.machine_factor(load=6.0, cpu_count=8) == 1.0


def test_the_user_factor_multiplies_the_machine_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TESTS_TIMEOUT_FACTOR", "3")
    assert bound(10) == pytest.approx(30 * bounds.machine_factor(), rel=0.5)
    assert bound(10) >= 30


def test_a_run_out_bound_names_the_factor(tmp_path: Path) -> None:
    """The failure report carries a "bounds" section naming GATEWAY_TESTS_TIMEOUT_FACTOR, the
    factor and the load it ran with; a failure of another kind does not."""
    (tmp_path / "test_slow.py").write_text(
        "import anyio, pytest\n"
        "from tests.conftest import bound\n"
        "async def _wait():\n"
        "    with anyio.fail_after(bound(0.01)):\n"
        "        await anyio.Event().wait()\n"
        "def test_runs_out():\n"
        "    anyio.run(_wait)\n"
        "def test_plain_failure():\n"
        "    assert 1 == 2\n"
    )
    done = run_with_suite_plugin(tmp_path / "test_slow.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("GATEWAY_TESTS_TIMEOUT_FACTOR=3") == 1, done.stdout
    assert "bounds are scaled by GATEWAY_TESTS_TIMEOUT_FACTOR (1)" in done.stdout
    assert "load per CPU" in done.stdout


def test_pytest_timeout_s_limit_scales_too(tmp_path: Path) -> None:
    """pyproject.toml's whole-test limit is a bound like the others: 1 s times factor 20 lets a
    test of 2 s finish."""
    (tmp_path / "test_long.py").write_text(
        "import time\ndef test_two_seconds():\n    time.sleep(2)\n"  # the clock is the subject
    )
    done = run_with_suite_plugin(tmp_path / "test_long.py", "-o", "timeout=1", factor="20")
    assert done.returncode == 0, done.stdout + done.stderr
