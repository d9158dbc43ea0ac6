"""Imports point up the layers of STYLE.md §2; the protocol core does no I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"
IO_MODULES = {"asyncio", "anyio", "socket", "starlette", "uvicorn", "websockets", "paho", "mcp",
              "sqlite3", "httpx2"}  # fmt: skip
# A module may import from the packages listed for its layer, never from the ones above it.
FORBIDDEN = {
    "protocol": {"gateway.devices", "gateway.transports", "gateway.mcp_server", "gateway.app",
                 "gateway.cli", "gateway.host_app", "gateway.simulator"},
    "devices": {"gateway.transports", "gateway.mcp_server", "gateway.app", "gateway.cli",
                "gateway.host_app"},
    "transports": {"gateway.mcp_server", "gateway.app", "gateway.cli", "gateway.host_app"},
    "simulator": {"gateway.devices", "gateway.transports", "gateway.app", "gateway.mcp_server"},
}  # fmt: skip


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_imports_point_up(layer: str) -> None:
    """No module imports from a layer above its own."""
    for path in (PACKAGE / layer).glob("*.py"):
        for name in imports_of(path):
            bad = [f for f in FORBIDDEN[layer] if name == f or name.startswith(f + ".")]
            assert not bad, f"{path.name} imports {name}"


def test_protocol_core_does_no_io() -> None:
    """gateway/protocol imports nothing that does I/O (STYLE.md rule 1)."""
    for path in (PACKAGE / "protocol").glob("*.py"):
        for name in imports_of(path):
            assert name.split(".")[0] not in IO_MODULES, f"{path.name} imports {name}"
