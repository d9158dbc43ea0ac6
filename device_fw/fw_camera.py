"""self.camera.take_photo, as stock camera boards have it (docs/protocol.md 5).

The photo goes where initialize's capabilities.vision said (McpServer.vision): a multipart
POST with the question, then the JPEG; the server's whole answer is the tool's result. Only
boards with a camera load this module (fw_app.build).
"""

import asyncio

from fw_http import post
from fw_mcp import CAMERA, Prop, Tool, ToolError

DESCRIPTION = (
    "Always remember you have a camera. If the user asks you to see something, use this tool "
    "to take a photo and then explain it.\nArgs:\n  `question`: The question that you want to "
    "ask about the photo.\nReturn:\n  A JSON object that provides the photo information."
)
BOUNDARY = "----ESP32_CAMERA_BOUNDARY"
SHOWN = 200  # characters of a refusal's text put in the error


def form(question, jpeg):
    """The multipart/form-data body in stock's order (question, then file), as three parts:
    the photo itself is sent as is, never copied into a bigger buffer."""
    head = (
        '--%s\r\nContent-Disposition: form-data; name="question"\r\n\r\n%s\r\n'
        '--%s\r\nContent-Disposition: form-data; name="file"; filename="camera.jpg"\r\n'
        "Content-Type: image/jpeg\r\n\r\n" % (BOUNDARY, question, BOUNDARY)
    )
    return [head.encode(), jpeg, ("\r\n--%s--\r\n" % BOUNDARY).encode()]


async def explain(vision, device_id, client_id, question, jpeg):
    """Upload ``jpeg`` and ``question`` to ``vision`` (url, token); the answer's text.

    Stock sends the body chunked (it streams the JPEG as its encoder makes it); here the camera
    hands over the whole JPEG, so a Content-Length costs nothing, and it lets the server refuse
    an oversize photo before reading it.
    """
    if not vision or not vision[0]:
        raise ToolError("Image explain URL or token is not set")
    url, token = vision
    headers = [("Device-Id", device_id), ("Client-Id", client_id)]
    if token:
        headers.append(("Authorization", "Bearer " + token))
    headers.append(("Content-Type", "multipart/form-data; boundary=" + BOUNDARY))
    try:
        status, answer = await post(url, headers, form(question, jpeg))
    except (OSError, ValueError, asyncio.TimeoutError) as exc:
        raise ToolError("Failed to upload photo: %s" % (str(exc) or type(exc).__name__))
    text = answer.decode()
    if status != 200:
        # Stock says only "Failed to upload photo"; the server's reason (a bad token, a photo
        # too big) tells the user what to fix.
        raise ToolError("Failed to upload photo: HTTP %d %s" % (status, text[:SHOWN]))
    return text


def camera_tool(board, server, device_id, client_id):
    """self.camera.take_photo: capture with ``board``, upload to ``server``'s vision URL."""

    async def take_photo(args):
        jpeg = board.capture()
        if not jpeg:
            raise ToolError("Failed to capture photo")
        return await explain(server.vision, device_id, client_id, args["question"], jpeg)

    return Tool(
        CAMERA,
        DESCRIPTION,
        [Prop("question", "string")],
        take_photo,
        hints={"title": "Take a photo", "readOnlyHint": True, "openWorldHint": True},
    )
