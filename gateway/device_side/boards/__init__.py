"""Boards that serve MCP themselves (mcp-c-sdk, ESP-Claw, mcpd): the gateway is their client.

``fleet.Boards`` keeps one ``board.Board`` per URL (added by the owner, or found over mDNS by
``discovery``); each opens the SDK's client transport and serves a ``link.BoardLink`` over it
as any device connection (docs/mcp-devices.md).
"""

from __future__ import annotations

from gateway.device_side.boards.board import board_id
from gateway.device_side.boards.fleet import Boards

__all__ = ["Boards", "board_id"]
