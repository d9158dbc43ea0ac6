"""Tests for gateway.launch: the absolute command that runs this gateway again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway import launch


def test_the_script_that_started_us_is_named_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started as ``./venv/bin/esp-mcp-gateway`` from elsewhere: the absolute path."""
    script = tmp_path / "venv" / "bin" / "esp-mcp-gateway"
    script.parent.mkdir(parents=True)
    script.touch()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["venv/bin/esp-mcp-gateway", "serve"])
    assert launch.program_argv() == [str(script)]


def test_python_dash_m_is_named_by_the_interpreter_unresolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m gateway`` from a venv without the script: that venv's python (a symlink,
    kept as is: resolving it would lose the venv) with ``-m gateway``."""
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "argv", ["/x/gateway/__main__.py"])
    monkeypatch.setattr(sys, "executable", str(python))
    assert launch.program_argv() == [str(python), "-m", "gateway"]
    (python.parent / "esp-mcp-gateway").touch()
    assert launch.program_argv() == [str(python.parent / "esp-mcp-gateway")]


def test_only_our_image_counts_as_a_container(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout in a dev container is the user's own; our image's venv is not, and the CLI
    is then reached through ``docker compose exec``."""
    monkeypatch.setattr(sys, "executable", "/opt/esp-mcp-gateway/bin/python")
    monkeypatch.setattr(launch, "Path", _with_dockerenv(launch.Path))
    assert launch.in_container()
    assert launch.exec_prefix() == "docker compose exec gateway esp-mcp-gateway"
    monkeypatch.setattr(sys, "executable", "/home/me/gateway/.venv/bin/python")
    assert not launch.in_container()


def _with_dockerenv(real: type[Path]) -> type[Path]:
    class WithDockerenv(type(real())):  # type: ignore[misc]
        def exists(self, *, follow_symlinks: bool = True) -> bool:
            return str(self) == "/.dockerenv" or super().exists()

    return WithDockerenv
