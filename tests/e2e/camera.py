"""A stock-like camera device: ``take_photo`` uploads exactly as stock xiaozhi firmware does.

docs/protocol.md §5: the device keeps ``capabilities.vision`` from ``initialize``; on
``self.camera.take_photo`` it POSTs a chunked multipart body (``question``, then ``file``
``camera.jpg``) with ``Device-Id``, ``Client-Id`` and ``Authorization: Bearer <token>``, and returns
the response body verbatim as its text result, or the error "Failed to upload photo" on any other
status than 200.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.e2e.helpers import JsonObject, RawDevice, stock_headers

BOUNDARY = "----ESP32_CAMERA_BOUNDARY"
CLIENT_ID = stock_headers()["Client-Id"]

TAKE_PHOTO: JsonObject = {
    "name": "self.camera.take_photo",
    "description": "Always remember you have a camera. If the user asks you to see something, "
    "use this tool to take a photo and then explain it.",
    "inputSchema": {
        "type": "object",
        "properties": {"question": {"type": "string"}},
        "required": ["question"],
    },
}
STATUS: JsonObject = {"name": "self.get_device_status", "description": "Status"}


def fake_jpeg(size: int = 3000) -> bytes:
    """Bytes that pass for a JPEG (its magic and end marker), different on every call."""
    return b"\xff\xd8\xff\xe0" + os.urandom(max(size - 6, 0)) + b"\xff\xd9"


@dataclass
class StockCamera(RawDevice):
    """A RawDevice with a camera that uploads ``photo`` (with ``token``, if set, as its token)."""

    photo: bytes = field(default_factory=fake_jpeg)
    token: str | None = None
    upload_as: str | None = None  # the Device-Id header of the upload, if not its own
    vision: JsonObject | None = None  # what initialize gave it
    uploads: list[int] = field(default_factory=list)  # HTTP status of each upload

    async def respond(self, message: JsonObject) -> JsonObject | None:
        """As RawDevice, but answering take_photo by uploading first."""
        payload = message.get("payload")
        if isinstance(payload, dict) and payload.get("method") == "initialize":
            capabilities = (payload.get("params") or {}).get("capabilities") or {}
            self.vision = capabilities.get("vision")
        if not isinstance(payload, dict) or payload.get("method") != "tools/call":
            return self._answer(message)
        params = payload.get("params") or {}
        if params.get("name") != TAKE_PHOTO["name"]:
            return self._answer(message)
        question = (params.get("arguments") or {}).get("question", "")
        reply: JsonObject = {"jsonrpc": "2.0", "id": payload["id"]}
        if not self.vision or not isinstance(self.vision.get("url"), str):
            reply["error"] = {"message": "Image explain URL or token is not set"}
        else:
            status, body = await self.upload(question)
            self.uploads.append(status)
            if status == 200:
                reply["result"] = {"content": [{"type": "text", "text": body}], "isError": False}
            else:
                reply["error"] = {"message": "Failed to upload photo"}
        return {"session_id": "", "type": "mcp", "payload": reply}

    async def upload(self, question: str) -> tuple[int, str]:
        """POST the photo as stock firmware does; the status (0: cut off) and the body."""
        assert self.vision is not None
        parts = urlsplit(self.vision["url"])
        token = self.token if self.token is not None else self.vision.get("token", "")
        head = [
            f"POST {parts.path} HTTP/1.1",
            f"Host: {parts.netloc}",
            f"Device-Id: {self.upload_as or self.device_id}",
            f"Client-Id: {CLIENT_ID}",
            *([f"Authorization: Bearer {token}"] if token else []),
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}",
            "Transfer-Encoding: chunked",
            "Connection: close",
        ]
        pieces = [
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="question"\r\n\r\n'.encode(),
            question.encode() + b"\r\n",
            (
                f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
                'filename="camera.jpg"\r\nContent-Type: image/jpeg\r\n\r\n'
            ).encode(),
            *(self.photo[i : i + 4096] for i in range(0, len(self.photo), 4096)),
            f"\r\n--{BOUNDARY}--\r\n".encode(),
        ]
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
            try:
                for piece in pieces:
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
            except ConnectionError:
                pass  # the gateway answered early (too large): read what it said
            try:
                response = await reader.read()
            except ConnectionError:
                return 0, ""
        finally:
            writer.close()
        status_line, _, rest = response.partition(b"\r\n")
        if not status_line:
            return 0, ""
        body = rest.partition(b"\r\n\r\n")[2]
        return int(status_line.split()[1]), body.decode()
