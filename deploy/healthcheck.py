"""The container's HEALTHCHECK: both listeners answer ``GET /healthz`` (exit 0), else exit 1.

It reads the configuration the way ``esp-mcp-gateway serve`` does (GATEWAY_CONFIG, then the
GATEWAY_* environment), so a listener moved by environment or by a mounted config file is still
found. Standard library plus the gateway's own config loader: slim images have no curl.
"""

from __future__ import annotations

import sys
import urllib.request

from gateway.config import ListenAddress, load_config

TIMEOUT = 4.0  # each; Docker's own --timeout (10 s) bounds the whole check


def url(address: ListenAddress) -> str:
    """Where this machine reaches a listener bound to ``address``."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(address.host, address.host)
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{address.port}/healthz"


def main() -> int:
    config = load_config()
    # No proxies: an http_proxy in the container's environment must not answer for localhost.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    for name, address in (("device", config.device_listen), ("host", config.host_listen)):
        try:
            with opener.open(url(address), timeout=TIMEOUT) as response:
                response.read()
        except OSError as exc:  # URLError and HTTPError are OSErrors
            print(f"unhealthy: {name} listener {url(address)}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
