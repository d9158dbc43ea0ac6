from typing import Any

from .fw_ws import WebSocket

HELLO_TIMEOUT: int
MAX_FRAME: int

class HelloError(Exception): ...

class WsLink:
    max_message: int
    url: str
    token: str | None
    device_id: str
    client_id: str
    ping_interval: float | None
    hello: dict[str, Any]
    session_id: str
    ws: WebSocket | None
    def __init__(
        self,
        url: str,
        token: str | None,
        device_id: str,
        client_id: str,
        ping_interval: float | None = 30,
        hello: dict[str, Any] | None = None,
    ) -> None: ...
    def headers(self) -> list[tuple[str, str]]: ...
    async def open(self) -> None: ...
    async def recv(self) -> dict[str, Any] | None: ...
    async def send(self, text: str) -> None: ...
    async def close(self) -> None: ...
    def abort(self) -> None: ...
