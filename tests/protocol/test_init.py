"""Tests for gateway.protocol's package surface: its exports and its freedom from I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import gateway.protocol

PROTOCOL_DIR = Path(gateway.protocol.__file__).parent
IO_MODULES = {"asyncio", "anyio", "socket", "ssl", "select", "selectors", "threading", "trio"}
IO_PACKAGES = {"starlette", "uvicorn", "websockets", "paho", "aiomqtt", "amqtt", "httpx"}


def test_all_names_are_exported_and_sorted() -> None:
    """Every name in __all__ exists, and __all__ is sorted without duplicates."""
    names = gateway.protocol.__all__
    assert all(hasattr(gateway.protocol, name) for name in names)
    assert names == sorted(set(names), key=lambda name: (not name.isupper(), name))


def test_public_api_is_pinned() -> None:
    """The main entry points stay importable from gateway.protocol."""
    assert {
        "DeviceProtocol",
        "State",
        "MalformedMessage",
        "decode",
        "encode",
        "mcp_envelope",
        "server_hello",
        "new_session_id",
        "classify",
        "IdAllocator",
        "ToolsListed",
        "CallSucceeded",
        "CallFailed",
        "MessageDropped",
    } <= set(gateway.protocol.__all__)


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_protocol_package_does_no_io() -> None:
    """No module of gateway/protocol imports an I/O or network library (STYLE rule 1)."""
    for path in sorted(PROTOCOL_DIR.glob("*.py")):
        forbidden = _imported_roots(path) & (IO_MODULES | IO_PACKAGES)
        assert not forbidden, f"{path.name} imports {forbidden}"
