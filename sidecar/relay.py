"""Forwarding one request to the upstream and its answer back, measured or not.

The hot path is `relay_sse`: each piece the upstream connection decodes is timed and written to
the client socket at once, from the upstream's data_received. Nothing is buffered beyond an
incomplete SSE event, and only when the sidecar itself asked for a usage chunk that it must
keep from the client. Unmeasured paths go through aiohttp's client (`relay_passthrough`).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from sidecar.fastrequest import SENT, FastRequest
from sidecar.http1 import HttpError
from sidecar.timing import StreamTimer
from sidecar.upstream import FAST_PATH, UpstreamFailed

# Hop-by-hop headers (RFC 9110 7.6.1) and the ones aiohttp recomputes.
_DROP_REQUEST = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                           "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
                           "expect"))   # the sidecar answers 100-continue itself and sends bodies whole
_DROP_RESPONSE = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                            "trailer", "trailers", "transfer-encoding", "upgrade", "content-length", "server", "date"))


class BodyTooLarge(Exception):
    pass


class BadRequestBody(Exception):
    """The request body cannot be read or parsed: a 400 in OpenAI's shape, counted as an error.
    `close`: the framing is broken, so the connection cannot carry another request."""

    def __init__(self, message: str, close: bool = False):
        super().__init__(message)
        self.close = close


def error_body(message: str, error_type: str, code: int) -> bytes:
    """OpenAI's error shape."""
    return json.dumps({"error": {"message": message, "type": error_type, "param": None, "code": code}}).encode()


def error_response(status: int, message: str, error_type: str, headers: dict | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(message, error_type, status),
                        content_type="application/json", headers=headers)


async def read_body(request: web.BaseRequest | FastRequest, limit: int) -> bytes:
    if isinstance(request, FastRequest):
        try:
            return await request.read_body(limit)
        except HttpError as exc:
            if exc.status == 413:
                raise BodyTooLarge() from None
            raise BadRequestBody(f"the request body is not valid HTTP/1.1 framing ({exc.reason})", close=True) from None
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge()
    if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= (1, 1):
        # The client waits (curl: 1 s) for this before sending a large body.
        request.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    chunks, size = [], 0
    while True:
        try:
            chunk = await request.content.readany()
        except HttpProcessingError as exc:
            # Bad chunked framing found after the handler started (a bad size in a later chunk).
            raise BadRequestBody(f"the request body is not valid HTTP/1.1 framing ({type(exc).__name__})",
                                 close=True) from None
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def upstream_headers(request: web.BaseRequest, measured: bool) -> dict[str, str]:
    headers = {}
    for name, value in request.headers.items():
        low = name.lower()
        if low in _DROP_REQUEST:
            continue
        # Measured answers must arrive uncompressed for the timer to read them; SSE is rarely
        # compressed anyway, and the bytes on the loopback/pod network cost nothing.
        if measured and low == "accept-encoding":
            continue
        headers[name] = value
    return headers


def response_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE}


async def open_upstream(session: aiohttp.ClientSession, method: str, url: str, headers: dict,
                        body: bytes | None) -> aiohttp.ClientResponse:
    try:
        return await session.request(method, url, headers=headers, data=body, allow_redirects=False)
    except asyncio.TimeoutError:
        raise UpstreamFailed(504, "upstream_timeout", "the upstream did not answer in time") from None
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamFailed(502, "upstream_unreachable", f"cannot connect to the upstream: {exc.os_error.strerror or exc}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamFailed(502, "upstream_error", f"the upstream failed: {type(exc).__name__}") from None


async def relay_passthrough(request: web.BaseRequest, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    """Relay an unmeasured answer (any path but the completions ones) as it arrives."""
    if isinstance(request, FastRequest):
        return await _relay_passthrough_fast(request, upstream)
    out = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=response_headers(upstream))
    await out.prepare(request)
    try:
        while data := await upstream.content.readany():
            await out.write(data)
    except (asyncio.TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        upstream.close()    # the body is cut short; the client sees the connection end early
        request.transport.close() if request.transport is not None else None
        return out
    await out.write_eof()
    return out


async def _relay_passthrough_fast(request: FastRequest, upstream: aiohttp.ClientResponse):
    request.transport.write(request.start_response(upstream.status, upstream.reason, response_headers(upstream)))
    try:
        while data := await upstream.content.readany():
            request.write(data)
            await request.drain()
    except (asyncio.TimeoutError, aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        upstream.close()
        request.abort()
        return SENT
    request.end_response()
    return SENT


# ---- the measured path, on sidecar.upstream's protocol-level client --------------------------
_HIGH_WATER = 256 * 1024     # bytes queued for a slow client before the upstream is paused


def head_headers(headers: list[tuple[str, str]]) -> dict[str, str]:
    return {k: v for k, v in headers if k.lower() not in _DROP_RESPONSE}


async def relay_sse(request: web.BaseRequest, conn, timer: StreamTimer, clock) -> tuple[web.StreamResponse, str | None]:
    """Relay an SSE body from `conn` (sidecar.upstream.Connection) to the client as it arrives.

    Each upstream piece is timed and written to the client socket from the upstream's
    data_received, without a task switch; returns (response, error type of a mid-stream failure).
    """
    if isinstance(request, FastRequest):
        out = SENT
        head = request.start_response(conn.head.status, conn.head.reason, head_headers(conn.head.headers))
        chunked = request.chunked
    else:
        out = _SseResponse(status=conn.head.status, reason=conn.head.reason, headers=head_headers(conn.head.headers))
        await out.prepare(request)
        head = _take_headers(out)
        # HTTP/1.1 clients get chunked framing; an HTTP/1.0 client gets the bytes until the close.
        chunked = getattr(out._payload_writer, "chunked", True)
    transport = request.transport
    relay = timer.relay
    loop = asyncio.get_running_loop()
    paused = []
    # Our own chunked body ends with the upstream's: when its last chunk arrives in the same read
    # as the last bytes (as a stream's [DONE] and the terminal chunk usually do), the terminal
    # chunk leaves in the same write. One send less per request; sends are what a proxy pays most.
    ends_with_upstream = out is SENT and chunked
    terminated = False

    def hold_upstream() -> None:
        # The client reads slower than the upstream writes: stop reading it until the client drains.
        paused.append(True)
        conn.pause()
        loop.create_task(_resume_when_drained(transport, conn, paused))

    def pressure() -> None:
        # The C path's hand-back when the client's buffer is full: Python's again, held.
        conn._fast = None
        if not paused:
            hold_upstream()

    # The C fast path (sidecar/_fastrelay.c): armed after any read the Python path handled, once
    # the head is out and the timer is past its first token, it takes each later read that is one
    # chunk holding one ordinary token: timed and written exactly as `sink` would, without Python.
    fast = (transport.write, timer, timer.gaps, transport.get_write_buffer_size, _HIGH_WATER, pressure,
            transport.is_closing) if ends_with_upstream and FAST_PATH else None

    def sink(data: bytes) -> None:
        nonlocal head, terminated
        forward = relay(data, clock())
        if forward and not transport.is_closing():
            frame = b"%x\r\n%s\r\n" % (len(forward), forward) if chunked else forward
            if head:
                frame, head = head + frame, b""   # status line and headers leave with the first bytes
            if ends_with_upstream and conn.body_complete:
                frame += b"0\r\n\r\n"
                terminated = True
            transport.write(frame)
            if not paused and transport.get_write_buffer_size() > _HIGH_WATER:
                hold_upstream()
        if fast is not None:
            # Re-decided after every read Python handled: a partial event it now holds (an event
            # split across chunks) must have its next chunk come here too, to be joined.
            conn._fast = fast if not head and not paused and not terminated and timer.plain_next else None

    try:
        error_type = await conn.start_body(sink)
    finally:
        if fast is not None:
            conn._fast = None
    if head and not transport.is_closing():
        transport.write(head)
    if error_type is not None and not transport.is_closing():
        # The client gets an SSE error event and a clean end of stream.
        message = "the upstream stopped in the middle of the stream" if error_type == "upstream_disconnected" \
            else "the upstream sent nothing for too long"
        event = b"data: " + error_body(message, error_type, 504 if error_type == "upstream_timeout" else 502) \
            + b"\n\ndata: [DONE]\n\n"
        transport.write(b"%x\r\n%s\r\n" % (len(event), event) if chunked else event)
    if out is SENT:
        request.end_response(terminated=terminated)
    else:
        await out.write_eof()
    return out, error_type


class _SseResponse(web.StreamResponse):
    # Keep the headers in the writer after prepare() (as aiohttp's Response does) so that
    # _take_headers can send them together with the first event: one send less per request.
    _send_headers_immediately = False


def _take_headers(out: web.StreamResponse) -> bytes:
    """The response's status line and headers, taken from aiohttp's writer to be sent by us.

    aiohttp (3.10+) holds the headers after prepare() to coalesce them with the first body
    write; since body bytes go straight to the socket here, we take them over the same way.
    With a writer that does not buffer them, they are simply sent now.
    """
    writer = out._payload_writer
    head = getattr(writer, "_headers_buf", None)
    if head and not getattr(writer, "_headers_written", True):
        writer._headers_buf = None
        writer._headers_written = True
        return bytes(head)
    writer.send_headers() if hasattr(writer, "send_headers") else None
    return b""


async def _resume_when_drained(transport, conn, paused: list) -> None:
    while transport.get_write_buffer_size() > _HIGH_WATER // 4 and not transport.is_closing():
        await asyncio.sleep(0.005)
    paused.clear()
    conn.resume()


async def send_body(request: web.BaseRequest, conn) -> tuple[web.StreamResponse, bytes]:
    """Read a whole (non-streaming) answer from `conn`, then send it; returns (response, body)."""
    body = await conn.read_body()
    if isinstance(request, FastRequest):
        request.send(conn.head.status, conn.head.reason, head_headers(conn.head.headers), body)
        return SENT, body
    out = web.Response(status=conn.head.status, reason=conn.head.reason, body=body, headers=head_headers(conn.head.headers))
    await out.prepare(request)
    await out.write_eof()
    return out, body
