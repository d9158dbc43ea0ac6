from collections.abc import Callable
from typing import Any

MESSAGE: str
LEVELS: tuple[str, ...]

class Events:
    send: Callable[[dict[str, Any]], None]
    rate: float
    burst: int
    clock: Callable[[], int]
    tokens: float
    dropped: int
    def __init__(
        self,
        send: Callable[[dict[str, Any]], None],
        rate: float = 2.0,
        burst: int = 5,
        clock: Callable[[], int] | None = None,
    ) -> None: ...
    def emit(self, logger: str, data: Any, level: str = "info") -> bool: ...
    def press(self, button: str) -> bool: ...
    def reading(
        self, logger: str, value: float, delta: float = 0, unit: str | None = None
    ) -> bool: ...
    def threshold(
        self,
        logger: str,
        value: float,
        limit: float,
        hysteresis: float = 0,
        unit: str | None = None,
    ) -> bool: ...
