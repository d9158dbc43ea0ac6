from collections.abc import Iterable
from typing import Any

TEXT: int
BINARY: int
CLOSE: int
PING: int
PONG: int
MAX_MESSAGE: int

class HandshakeError(Exception):
    status: int
    def __init__(self, status: int, message: str) -> None: ...

async def connect(
    url: str, headers: Iterable[tuple[str, str]] = (), timeout: float = 10
) -> WebSocket: ...

class WebSocket:
    reader: Any
    writer: Any
    closed: bool
    timeout: float | None
    def __init__(self, reader: Any, writer: Any) -> None: ...
    async def recv(self) -> str | bytes | None: ...
    async def send(self, text: str) -> None: ...
    async def ping(self, data: bytes = b"") -> None: ...
    async def close(self, code: int = 1000) -> None: ...
    def abort(self) -> None: ...
