"""scripts/test on a bare machine: what it installs, what it says when it cannot, and the gate.

``tests.programs`` decides; these tests give it a PATH without the suite's programs and record
the commands instead of running apt-get or npm.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.programs import COVERAGE_GATE, DEBIAN, INSTALL_MCPB, gate_arguments, install


def bare_path(tmp_path: Path, *programs: str) -> str:
    """A PATH holding only ``programs`` (never run: the recorder stands in for them)."""
    where = tmp_path / "bin"
    where.mkdir()
    for name in programs:
        (where / name).write_text("#!/bin/sh\nexit 1\n")
        (where / name).chmod(0o755)
    return str(where)


class Recorder:
    def __init__(self, fails: str = "") -> None:
        self.commands: list[list[str]] = []
        self.fails = fails

    def __call__(self, command: list[str]) -> int:
        self.commands.append(command)
        return 1 if self.fails and self.fails in command else 0


def test_as_root_it_installs_the_debian_programs_and_the_mcpb_cli(tmp_path: Path) -> None:
    """Root, no mosquitto/socat/chromium, npm present: apt-get update + install, then npm."""
    run = Recorder()
    path = bare_path(tmp_path, "npm")
    problems = install([], run=run, euid=0, sudo=lambda: False, path=path, root=tmp_path)
    assert problems == []
    update, apt, npm = run.commands
    assert update == ["apt-get", "update", "-q"]
    assert apt[-len(set(DEBIAN.values())) :] == sorted(set(DEBIAN.values()))
    assert "install" in apt and "-y" in apt and "DEBIAN_FRONTEND=noninteractive" in apt
    assert npm[:3] == ["npm", "install", "--prefix"]
    assert npm[-2:] == ["@anthropic-ai/mcpb@2", "@modelcontextprotocol/sdk@1"]


def test_with_passwordless_sudo_apt_get_runs_under_sudo(tmp_path: Path) -> None:
    run = Recorder()
    install(["shellcheck"], run=run, euid=1000, sudo=lambda: True, path=bare_path(tmp_path))
    assert all(command[:2] == ["sudo", "-n"] for command in run.commands)
    assert "shellcheck" in run.commands[1]  # .ci/run's extra programs join the same install


def test_extra_programs_are_installed_by_their_package(tmp_path: Path) -> None:
    """qemu-aarch64-static comes in qemu-user-static, update-binfmts in binfmt-support."""
    run = Recorder()
    install(["qemu-aarch64-static", "update-binfmts"], run=run, euid=0, sudo=lambda: False,
            path=bare_path(tmp_path))  # fmt: skip
    assert {"qemu-user-static", "binfmt-support"} <= set(run.commands[1])
    assert "qemu-aarch64-static" not in run.commands[1]


def test_without_root_or_sudo_or_npm_it_says_what_to_run_and_installs_nothing(
    tmp_path: Path,
) -> None:
    """Nothing is run; each problem names the missing programs and the command for them."""
    run = Recorder()
    path = bare_path(tmp_path)
    problems = install([], run=run, euid=1000, sudo=lambda: False, path=path, root=tmp_path)
    assert run.commands == []
    debian, mcpb = problems
    assert debian.startswith("mosquitto, mosquitto_passwd, socat, openssl, chromium: not root")
    assert "sudo apt-get install chromium mosquitto openssl socat" in debian
    assert "npm is not installed" in mcpb and INSTALL_MCPB in mcpb


def test_a_failing_apt_get_is_reported(tmp_path: Path) -> None:
    run = Recorder(fails="update")
    problems = install([], run=run, euid=0, sudo=lambda: False, path=bare_path(tmp_path, "mcpb"))
    assert len(run.commands) == 1 and problems == [
        "mosquitto, mosquitto_passwd, socat, openssl, chromium: apt-get install "
        "chromium mosquitto openssl socat failed"
    ]


def test_nothing_missing_nothing_run(tmp_path: Path) -> None:
    run = Recorder()
    path = bare_path(tmp_path, *DEBIAN, "mcpb")
    assert install([], run=run, euid=0, sudo=lambda: True, path=path) == []
    assert run.commands == []


@pytest.mark.parametrize("no_skips", [False, True])
def test_the_gate_is_90_percent_of_everything_when_nothing_was_skipped(no_skips: bool) -> None:
    arguments, note = gate_arguments([], no_skips=no_skips)
    assert f"--fail-under={COVERAGE_GATE}" in arguments and COVERAGE_GATE == 90
    assert not any(a.startswith("--omit") for a in arguments) and note == ""


def test_skips_for_missing_programs_leave_out_only_what_their_tests_cover() -> None:
    """Without mosquitto the MQTT modules are left out, said aloud; 90% of the rest holds."""
    arguments, note = gate_arguments(["mosquitto", "socat"], no_skips=False)
    (omit,) = [a for a in arguments if a.startswith("--omit=")]
    assert set(omit.removeprefix("--omit=").split(",")) == {
        "gateway/device_side/transports/mqtt/transport.py",
        "gateway/device_side/transports/mqtt/liveness.py",
        "gateway/cli/flashing/serial_tools.py",
        "gateway/cli/flashing/board.py",
        "gateway/cli/flashing/commands.py",
    }
    assert f"--fail-under={COVERAGE_GATE}" in arguments
    assert "mosquitto, socat" in note and "asks 90% of the rest" in note


def test_ci_leaves_nothing_out() -> None:
    """Under GATEWAY_TESTS_NO_SKIPS the skip itself failed the run; the gate stays whole."""
    arguments, note = gate_arguments(["mosquitto"], no_skips=True)
    assert not any(a.startswith("--omit") for a in arguments) and note == ""


def test_a_program_no_module_depends_on_changes_nothing() -> None:
    """mcpb's tests check the bundle, not gateway code: its skip omits nothing."""
    arguments, note = gate_arguments(["mcpb"], no_skips=False)
    assert not any(a.startswith("--omit") for a in arguments) and note == ""
