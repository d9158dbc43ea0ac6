from .fw_board import Board
from .fw_mcp import McpServer, Tool

DESCRIPTION: str
BOUNDARY: str
SHOWN: int

def form(question: str, jpeg: bytes) -> list[bytes]: ...
async def explain(
    vision: tuple[str, str] | None, device_id: str, client_id: str, question: str, jpeg: bytes
) -> str: ...
def camera_tool(board: Board, server: McpServer, device_id: str, client_id: str) -> Tool: ...
