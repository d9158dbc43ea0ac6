"""How this gateway was started, for the commands it hands out: absolute, and container-aware.

An MCP host's config (Claude Desktop's) starts the gateway without the user's shell: no venv on
PATH, another working directory. So a pasted ``command`` must be the absolute path of what runs
now (``sys.argv[0]``, the venv's console script, or ``sys.executable -m gateway``). Inside a
container that path means nothing on the user's desktop, and the CLI is reached through
``docker compose exec``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = [
    "COMPOSE_SERVICE",
    "IMAGE_VENV",
    "SCRIPT",
    "exec_prefix",
    "in_container",
    "in_home_assistant",
    "program_argv",
]

SCRIPT = "esp-mcp-gateway"  # the console script's name (pyproject.toml [project.scripts])
COMPOSE_SERVICE = "gateway"  # the service name in deploy/compose.yaml
IMAGE_VENV = "/opt/esp-mcp-gateway"  # where the Dockerfile installs the gateway


def program_argv() -> list[str]:
    """The absolute command that runs this program again: its script, or Python with ``-m``."""
    started = Path(sys.argv[0])
    if started.name == SCRIPT and started.exists():
        return [os.path.abspath(started)]
    # No symlinks resolved: a venv's python is a link, and only its own path keeps the venv.
    beside = Path(os.path.abspath(sys.executable)).parent / SCRIPT
    if beside.exists():
        return [str(beside)]
    return [os.path.abspath(sys.executable), "-m", "gateway"]


def in_container() -> bool:
    """True when this runs from our image (Dockerfile: its venv in ``IMAGE_VENV``) in a Docker or
    Podman container, where the user's shell is outside. A dev container running a checkout is
    not: its paths are the user's own."""
    container = Path("/.dockerenv").exists() or Path("/run/.containerenv").exists()
    return container and Path(os.path.abspath(sys.executable)).is_relative_to(IMAGE_VENV)


def exec_prefix() -> str:
    """What a user types before a CLI command for this gateway, as a shell line: ``docker
    compose exec gateway esp-mcp-gateway`` in our image; ``esp-mcp-gateway`` when that is on
    PATH; else the path they started it by, or this Python with ``-m gateway``."""
    if in_container():
        return f"docker compose exec {COMPOSE_SERVICE} {SCRIPT}"
    script = Path(sys.argv[0])
    if script.name == SCRIPT:
        on_path = shutil.which(SCRIPT)
        if on_path and Path(on_path).resolve() == script.resolve():
            return SCRIPT
        if script.exists():  # a venv's script, not on PATH: the path as typed
            return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m gateway"


def in_home_assistant() -> bool:
    """True as a Home Assistant add-on: the Supervisor gives every add-on its token."""
    return "SUPERVISOR_TOKEN" in os.environ
