"""A fresh clone without socat or mosquitto: the tests that need them skip, saying what to install.

CONTRIBUTING.md (where the README sends for what the tests need) promises skips (not errors)
where Debian's programs are missing, and CI (GATEWAY_TESTS_NO_SKIPS=1) turns any such skip into
a failure. Each test runs pytest as a user
would, on a PATH without the program.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import bound

ROOT = Path(__file__).resolve().parent.parent

NEEDS = [
    pytest.param(
        "tests/cli/flashing/test_board_commands.py::"
        "test_provision_copies_firmware_and_config_over_the_raw_repl",
        "socat is not installed (sudo apt-get install socat)",
        id="socat",
    ),
    pytest.param(
        "tests/device_side/transports/test_mqtt.py::test_status_online_opens_a_link_and_offline_closes_it",
        "mosquitto is not installed (sudo apt-get install mosquitto)",
        id="mosquitto",
    ),
]


def run_pytest(test: str, empty_path: Path, *, no_skips: bool) -> subprocess.CompletedProcess[str]:
    # PATH holds nothing: this venv's own scripts (the MicroPython unix port) are still found
    # beside its python, as they are on a fresh clone's .venv.
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_TESTS_NO_SKIPS"}
    env["PATH"] = str(empty_path)
    env["GATEWAY_TESTS_SKIPPED_FOR"] = str(empty_path / "skipped-for")  # as scripts/test sets
    if no_skips:
        env["GATEWAY_TESTS_NO_SKIPS"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", test],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=bound(120),
    )  # fmt: skip


@pytest.mark.parametrize(("test", "message"), NEEDS)
def test_a_missing_program_skips_with_the_apt_package_to_install(
    test: str, message: str, tmp_path: Path
) -> None:
    """The skip names the Debian package (never pip) and the run passes.

    scripts/test's coverage gate learns which program the skip wanted.
    """
    done = run_pytest(test, tmp_path, no_skips=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout and message in done.stdout
    assert "pip install" not in done.stdout and "AssertionError" not in done.stdout
    assert (tmp_path / "skipped-for").read_text() == f"{message.split()[0]}\n"


@pytest.mark.parametrize(("test", "message"), NEEDS)
def test_ci_fails_on_the_skip(test: str, message: str, tmp_path: Path) -> None:
    """Under GATEWAY_TESTS_NO_SKIPS=1 (.ci/run) the same skip fails the run."""
    done = run_pytest(test, tmp_path, no_skips=True)
    assert done.returncode == 1
    assert message in done.stdout and "CI treats a skip as a failure" in done.stderr
