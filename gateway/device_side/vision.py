"""The camera upload endpoint, ``/vision/explain``, and the per-device tokens that open it.

Stock firmware learns where to send photos only from ``initialize``: ``capabilities.vision =
{url, token}`` (docs/protocol.md §4). During ``self.camera.take_photo`` it POSTs the JPEG as
multipart form data (a ``question`` field, then ``file``) with ``Authorization: Bearer <token>``
and ``Device-Id``, and returns the response body, unparsed, as the tool's result (§5). So the
body is a short text for the model, and a refusal is also said to the call waiting for the photo
(``PhotoStore.refuse``): the device itself only reports "Failed to upload photo".

Each device session gets a random token of its own: it opens the endpoint for that device
alone and dies with the session, so a token seen on the wire (``initialize`` travels over plain
WebSocket or MQTT) is worthless once the device reconnects, is forgotten or is rebound.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.devices.photos import PhotoStore, image_type

__all__ = ["VISION_PATH", "Elsewhere", "Forward", "VisionEndpoint", "VisionTokens"]

logger = logging.getLogger(__name__)

VISION_PATH = "/vision/explain"
_TOKEN_CHARS = 32
_QUESTION_BYTES = 4096
_FORM_OVERHEAD = 64 * 1024  # multipart headers and the question, beyond the photo itself


class VisionTokens:
    """The upload token of each device's current session (in memory only)."""

    def __init__(self) -> None:
        self._tokens: dict[str, str] = {}

    def issue(self, device_id: str) -> str:
        """A new token for ``device_id``'s session starting now (its previous one stops working)."""
        token = self._tokens[device_id.lower()] = secrets.token_hex(_TOKEN_CHARS // 2)
        return token

    def revoke(self, device_id: str, token: str) -> None:
        """The session that was given ``token`` ended (a newer session's token stays)."""
        if self._tokens.get(device_id.lower()) == token:
            del self._tokens[device_id.lower()]

    def admits(self, device_id: str, token: str) -> bool:
        """True if ``token`` is the upload token of ``device_id``'s current session."""
        expected = self._tokens.get(device_id.lower())
        given = token.encode("utf-8", "surrogateescape")
        return expected is not None and hmac.compare_digest(expected.encode(), given)


class _TooLarge(Exception):
    pass


Forward = Callable[[Mapping[str, str], bytes], Awaitable[Response]]
"""Hands an upload (its headers and body) on, and answers the device with what came back."""
Elsewhere = Callable[[str], Forward | None]
"""Where an upload that no call of the device waits for goes instead (by device id), if anywhere:
a proxied device's voice server asked for it (docs/voice-proxy.md)."""


class VisionEndpoint:
    """``POST /vision/explain``: check, keep and hand on one photo."""

    def __init__(
        self,
        tokens: VisionTokens,
        photos: PhotoStore,
        max_photo_bytes: int,
        elsewhere: Elsewhere | None = None,
    ) -> None:
        self._tokens = tokens
        self._photos = photos
        self._max_bytes = max_photo_bytes
        self._elsewhere = elsewhere

    def routes(self) -> list[Route]:
        """The endpoint's route on the device listener."""
        return [Route(VISION_PATH, self.upload, methods=["POST"])]

    async def upload(self, request: Request) -> Response:
        """Take one photo from a device during one of its calls."""
        device_id = request.headers.get("device-id", "").strip().lower()
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if not device_id or scheme.lower() != "bearer" or not self._tokens.admits(device_id, token):
            # Said to the uploader only: a stranger's upload must not reach any device's call.
            return _answer(401, "refused: this upload token is not the one given to that device")
        if not self._photos.waiting(device_id):
            forward = self._elsewhere(device_id) if self._elsewhere is not None else None
            if forward is not None:
                return await self._hand_on(request, forward)
            return _answer(409, "refused: no call of this device is waiting for a photo")
        try:
            question, data = await self._read_form(request)
        except _TooLarge:
            return self._refuse(device_id, 413, f"the photo is larger than {self._limit_text()}")
        except MultiPartException as exc:
            return self._refuse(device_id, 400, f"the upload is not a valid form: {exc.message}")
        except ClientDisconnect:  # the device went away, or was cut off (limits.auth_timeout)
            return self._refuse(device_id, 400, "the upload was cut off before the photo arrived")
        if data is None:
            return self._refuse(device_id, 400, "the upload has no `file` part with the photo")
        mime = image_type(data)
        if mime is None:
            return self._refuse(device_id, 415, "the upload is not a JPEG or PNG image")
        photo = await self._photos.keep(device_id, data, mime, question)
        logger.info("photo from %s: %d bytes (%s)", device_id, photo.size, mime)
        kind = "JPEG" if mime == "image/jpeg" else "PNG"
        text = f"Photo taken ({_kib(photo.size)} {kind}); it is attached to this result as an image"
        if question:
            text += f": look at it to answer {question[:200]!r}"
        return _answer(200, text + ".", success=True)

    async def _hand_on(self, request: Request, forward: Forward) -> Response:
        """An upload the device's voice server asked for: the whole body, handed on as is."""
        try:
            limit = self._max_bytes + _FORM_OVERHEAD
            body = b"".join([chunk async for chunk in _capped(request.stream(), limit)])
        except _TooLarge:
            return _answer(413, f"refused: the photo is larger than {self._limit_text()}")
        except ClientDisconnect:
            return _answer(400, "refused: the upload was cut off before the photo arrived")
        return await forward(request.headers, body)

    async def _read_form(self, request: Request) -> tuple[str, bytes | None]:
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > self._max_bytes + _FORM_OVERHEAD:
            raise _TooLarge  # said before reading a byte of it
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise MultiPartException("expected multipart/form-data")
        parser = MultiPartParser(
            request.headers,
            _capped(request.stream(), self._max_bytes + _FORM_OVERHEAD),
            max_files=1,
            max_fields=1,
            max_part_size=_QUESTION_BYTES,
        )
        form = await parser.parse()
        try:
            question, upload = form.get("question"), form.get("file")
            data = await upload.read() if isinstance(upload, UploadFile) else None
        finally:
            await form.close()
        if data is not None and len(data) > self._max_bytes:
            raise _TooLarge
        return (question if isinstance(question, str) else ""), data

    def _refuse(self, device_id: str, status: int, reason: str) -> Response:
        logger.warning("photo from %s refused: %s", device_id, reason)
        self._photos.refuse(device_id, reason)
        return _answer(status, f"refused: {reason}")

    def _limit_text(self) -> str:
        return f"the gateway's limit of {_kib(self._max_bytes)} (vision.max_photo_bytes)"


async def _capped(stream: AsyncIterator[bytes], limit: int) -> AsyncGenerator[bytes, None]:
    """The request body, cut off with ``_TooLarge`` once it passes ``limit`` bytes."""
    total = 0
    async for chunk in stream:
        total += len(chunk)
        if total > limit:
            raise _TooLarge
        yield chunk


def _kib(size: int) -> str:
    return f"{size / 1024:.0f} KiB" if size >= 1024 else f"{size} bytes"


def _answer(status: int, text: str, *, success: bool = False) -> Response:
    # The shape stock firmware's comments expect; its text becomes the tool's result verbatim.
    body = {"success": True, "result": text} if success else {"success": False, "message": text}
    return Response(json.dumps(body), status_code=status, media_type="application/json")
