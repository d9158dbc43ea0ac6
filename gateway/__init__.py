"""esp-mcp-gateway: the tools of ESP32 devices as one standard MCP server."""

__version__ = "0.1.0"

__all__ = ["__version__"]
