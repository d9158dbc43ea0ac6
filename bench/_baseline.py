"""The uvicorn every bare baseline server of the benchmarks runs on (one home for it)."""

from __future__ import annotations

from typing import Any

import uvicorn


def baseline_config(app: Any) -> uvicorn.Config:
    """A quiet uvicorn for ``app`` on h11, the parser the gateway's listeners use.

    Left to choose, uvicorn takes httptools wherever it is installed, and the ratios would then
    compare two HTTP parsers as well as the servers.
    """
    return uvicorn.Config(app, http="h11", lifespan="off", log_level="warning",
                          access_log=False, timeout_graceful_shutdown=2)  # fmt: skip
