"""HTTP/1.1 over asyncio streams: what fw_ws's upgrade and the camera's upload share, and POST.

Stock MicroPython has no asyncio HTTP client (urequests blocks every other task), so this is
ours: one request per connection (``Connection: close``), TLS for https:// where the port has
ssl, a body of several parts sent one after another, and an answer of bounded size.

    status, body = await post("http://gw:8765/vision/explain", [("Device-Id", "aa:bb:...")],
                              [b"--boundary...", jpeg, b"--boundary--"])
"""

import asyncio

import fw_compat as compat

MAX_ANSWER = 16384  # the answer becomes a tool result: it must fit one WebSocket message
_SLICE = 4096  # bytes written at a time: a board never copies a whole photo into a buffer


def parse_url(url, schemes=("http", "https")):
    """(tls, host, port, path) of a URL of the two ``schemes`` (plain, then TLS)."""
    scheme, _, rest = url.partition("://")
    if scheme not in schemes:
        raise ValueError("not a %s:// URL: %s" % (schemes[0], url))
    tls = scheme == schemes[1]
    hostport, slash, path = rest.partition("/")
    host, colon, port = hostport.rpartition(":")
    if not colon or "]" in port:
        host, port = hostport, "443" if tls else "80"
    return tls, host.strip("[]"), int(port), slash + path if slash else "/"


async def open_stream(url, timeout, schemes=("http", "https")):
    """Connect to ``url``'s host, with TLS for the second scheme: (reader, writer, the path,
    the Host header's value); OSError if unreachable."""
    tls, host, port, path = parse_url(url, schemes)
    extra = {"ssl": True} if tls else {}
    reader, writer = await compat.wait_for(asyncio.open_connection(host, port, **extra), timeout)
    name = "[%s]" % host if ":" in host else host
    return reader, writer, path, name if port == (443 if tls else 80) else "%s:%d" % (name, port)


def request_head(method, path, host, headers):
    """An HTTP/1.1 request head: the request line, Host, then ``headers`` (name, value) pairs."""
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: " + host]
    lines += ["%s: %s" % (name, value) for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_head(reader):
    """(status, status line, {lower-case header name: value}) of an HTTP response (status 0:
    not HTTP); OSError if the connection ends first."""
    status_line = (await reader.readline()).decode().strip()
    parts = status_line.split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    headers = {}
    while True:
        line = await reader.readline()
        if not line:
            raise OSError("connection closed in the HTTP response head")
        if line in (b"\r\n", b"\n"):
            return status, status_line, headers
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()


async def post(url, headers, parts, timeout=30):
    """POST the bytes-like ``parts`` back to back as one body (with its Content-Length) and
    return (status, answer bytes).

    OSError if the server cannot be reached or breaks off, ValueError for a bad URL or a
    garbled answer, asyncio.TimeoutError after ``timeout`` seconds.
    """
    reader, writer, path, host = await open_stream(url, timeout)
    try:
        return await compat.wait_for(_exchange(reader, writer, path, host, headers, parts),
                                     timeout)  # fmt: skip
    finally:
        compat.abort(writer)  # Connection: close; the answer has been read in full


async def _exchange(reader, writer, path, host, headers, parts):
    size = sum(len(part) for part in parts)
    fixed = [("Content-Length", str(size)), ("Connection", "close")]
    writer.write(request_head("POST", path, host, list(headers) + fixed))
    for part in parts:
        view = memoryview(part)
        for start in range(0, len(view), _SLICE):
            writer.write(view[start : start + _SLICE])
            await writer.drain()
    await writer.drain()
    status, _, answer = await read_head(reader)
    return status, await _read_body(reader, answer)


async def _read_body(reader, headers):
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        total = 0
        while True:
            size = int((await reader.readline()).decode().split(";")[0].strip(), 16)
            if not size:
                return b"".join(chunks)  # trailers unread: the connection closes anyway
            total += size
            _check(total)
            chunks.append(await reader.readexactly(size))
            await reader.readline()
    length = headers.get("content-length")
    if length is not None:
        _check(int(length))
        return await reader.readexactly(int(length))
    chunks = []
    total = 0
    while True:  # neither: the answer ends when the server closes
        chunk = await reader.read(1024)
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        _check(total)
        chunks.append(chunk)


def _check(size):
    if size > MAX_ANSWER:
        raise ValueError("the answer is over %d bytes" % MAX_ANSWER)
