"""The Claude Desktop extension's server: ``esp-mcp-gateway stdio`` from the bundled source.

Claude Desktop runs ``uv run --directory <bundle> server/main.py`` (manifest.json), uv installs
the bundle's pyproject dependencies, and this file starts the gateway with MCP on stdio. The
user's settings arrive as ``GATEWAY_*`` variables; one left blank arrives empty, or as its
unreplaced ``${user_config.…}`` placeholder, and then means "the gateway's default".
"""

import os
import sys
from pathlib import Path

SETTINGS = ("GATEWAY_DATA_DIR", "GATEWAY_PUBLIC_URL", "GATEWAY_HOST_TOKEN")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
for name in SETTINGS:
    value = os.environ.get(name, "").strip()
    if not value or value.startswith("${"):
        os.environ.pop(name, None)

from gateway.cli import main  # noqa: E402  (after the path is set)

sys.exit(main(["stdio", *sys.argv[1:]]))
