"""A vision server for camera tests: where a device uploads its photo (docs/protocol.md §5).

A Starlette app on uvicorn that records every upload as the server parsed it and answers
like a vision service; each path answers differently (see :func:`vision_server`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from device_fw.fw_http import MAX_ANSWER
from tests.conftest import asgi_server

ANSWER = '{"success": true, "result": "An orange square."}'


@dataclass
class Upload:
    """One POST the vision server received."""

    path: str
    headers: list[tuple[str, str]]
    body: bytes
    question: str
    file: bytes
    filename: str | None
    file_type: str | None

    def header(self, name: str) -> str | None:
        values = [value for key, value in self.headers if key == name.lower()]
        assert len(values) <= 1, self.headers
        return values[0] if values else None


@asynccontextmanager
async def vision_server() -> AsyncIterator[tuple[str, list[Upload]]]:
    """A Starlette app on uvicorn (``asgi_server``); yields its base URL and uploads.

    ``/vision/explain`` answers ANSWER, ``/chunked`` a chunked answer, ``/refused`` 401 with
    a reason, ``/too-long`` an answer over the firmware's limit.
    """
    uploads: list[Upload] = []

    async def record(request: Request) -> None:
        body = await request.body()
        async with request.form() as parsed:
            photo = parsed["file"]
            assert isinstance(photo, UploadFile)
            uploads.append(
                Upload(
                    request.url.path,
                    [(k.decode(), v.decode()) for k, v in request.headers.raw],
                    body,
                    str(parsed["question"]),
                    await photo.read(),
                    photo.filename,
                    photo.headers.get("content-type"),
                )
            )

    async def explain(request: Request) -> Response:
        await record(request)
        return PlainTextResponse(ANSWER)

    async def chunked(request: Request) -> Response:
        await record(request)

        async def pieces() -> AsyncIterator[bytes]:
            for piece in ("A streamed ", "answer, ", "in three pieces"):
                yield piece.encode()

        return StreamingResponse(pieces(), media_type="text/plain")

    async def refused(request: Request) -> Response:
        await record(request)
        return PlainTextResponse("invalid vision token for this device", status_code=401)

    async def too_long(request: Request) -> Response:
        await record(request)
        return PlainTextResponse("x" * (MAX_ANSWER + 1))

    routes = [("/vision/explain", explain), ("/chunked", chunked), ("/refused", refused),
              ("/too-long", too_long)]  # fmt: skip
    app = Starlette(routes=[Route(path, view, methods=["POST"]) for path, view in routes])
    async with asgi_server(app, "test.vision_server") as url:
        yield url, uploads
